"""benchmarks.cold_start's runs (the GPU measures them): which caches each case gets."""

from benchmarks import cold_start


def test_binaries_runs_get_an_empty_cache_of_their_own_and_kept_caches_one_per_case(
    tmp_path, monkeypatch
):
    runs = []

    def run_case(case, cache_dir, temperature):
        runs.append((case, temperature, cache_dir))
        return {"case": case, "cache": temperature}

    monkeypatch.setattr(cold_start, "run_case", run_case)
    cold_start.measure(["train", "eager-train"], binaries=True, keep_cache=tmp_path / "keep")
    assert [(case, temperature) for case, temperature, _ in runs] == [
        ("train", "binaries"),
        ("train", "cold"),
        ("train", "warm"),
        ("eager-train", "cold"),
    ]
    binaries_cache, cold_cache, warm_cache = (cache for _, _, cache in runs[:3])
    assert binaries_cache != cold_cache == warm_cache == str(tmp_path / "keep" / "train")
    assert runs[3][2] == str(tmp_path / "keep" / "eager-train")
