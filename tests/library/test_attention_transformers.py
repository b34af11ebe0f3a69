"""Our attention registered with transformers (kernels.library.attention): a tiny Llama runs with
``attn_implementation="kernels_attention"`` and matches SDPA's logits and gradients, for a plain
batch, a padded batch (the varlen path) and packed sequences (position_ids restarts, padding
free), through ``from_pretrained`` and ``set_attn_implementation``, ``generate()``, and the
model's attention dropout in training; on transformers 4.57 (.venv) here, and on 5.x (.venv-tf5)
through tests/clients/transformers5/test_attention_transformers_5.py, which runs this module."""

import pytest
import torch

from kernels.library.attention import ATTENTION_IMPLEMENTATION, attention_kernel, register_attention
from tests.support.host_reads import OpNames
from tests.support.library import DEVICE
from tests.support.models import llama_config

transformers = pytest.importorskip("transformers")
from transformers import LlamaForCausalLM  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    register_attention()
    torch.manual_seed(0)
    config = llama_config(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        max_position_embeddings=128, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(DEVICE)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return path


@pytest.fixture
def calls(monkeypatch):
    """How many times each entry point of the kernel ran."""
    counts = {"flash_attn_func": 0, "flash_attn_varlen_func": 0, "flash_attn_with_kvcache": 0}
    kernel = attention_kernel()
    for name in counts:
        function = getattr(kernel, name)

        def counted(*args, _function=function, _name=name, **kwargs):
            counts[_name] += 1
            return _function(*args, **kwargs)

        monkeypatch.setattr(kernel, name, counted)
    return counts


def _load(path, implementation):
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=implementation).to(DEVICE)
    assert model.config._attn_implementation == implementation
    return model


def _logits_and_grads(model, **inputs):
    model.zero_grad()
    logits = model(**inputs).logits
    (
        logits.float().square() * torch.linspace(0, 1, logits.shape[-1], device=DEVICE)
    ).sum().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _assert_same(ours, theirs, rows=None):
    logits, grads = ours
    ref_logits, ref_grads = theirs
    if rows is not None:
        logits, ref_logits = logits[rows], ref_logits[rows]
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-3, atol=1e-4, msg=name)


def test_plain_and_padded_batches_match_sdpa(tiny_llama, calls):
    ours, sdpa = _load(tiny_llama, ATTENTION_IMPLEMENTATION), _load(tiny_llama, "sdpa")
    ids = torch.randint(0, 101, (2, 17), device=DEVICE)
    _assert_same(_logits_and_grads(ours, input_ids=ids), _logits_and_grads(sdpa, input_ids=ids))
    assert calls == {
        "flash_attn_func": 2,
        "flash_attn_varlen_func": 0,
        "flash_attn_with_kvcache": 0,
    }  # one call a layer
    # Right padding: the second sequence has 11 tokens; only its real rows are compared.
    mask = torch.ones(2, 17, dtype=torch.long, device=DEVICE)
    mask[1, 11:] = 0
    got = _logits_and_grads(ours, input_ids=ids, attention_mask=mask)
    ref_logits = sdpa(input_ids=ids, attention_mask=mask).logits.detach()
    torch.testing.assert_close(got[0][0], ref_logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[0][1, :11], ref_logits[1, :11], rtol=1e-4, atol=1e-4)
    assert calls["flash_attn_varlen_func"] == 2


def test_packed_sequences_match_separate_sequences(tiny_llama, calls):
    # Padding-free: two documents in one row, position_ids restarting, as
    # DataCollatorWithFlattening builds them; each must equal the document run alone.
    ours, sdpa = _load(tiny_llama, ATTENTION_IMPLEMENTATION), _load(tiny_llama, "sdpa")
    first, second = (torch.randint(0, 101, (1, n), device=DEVICE) for n in (9, 13))
    ids = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(9), torch.arange(13)])[None].to(DEVICE)
    packed = ours(input_ids=ids, position_ids=positions).logits
    with torch.no_grad():
        alone = torch.cat([sdpa(input_ids=first).logits, sdpa(input_ids=second).logits], dim=1)
    torch.testing.assert_close(packed.detach(), alone, rtol=1e-4, atol=1e-4)
    assert calls == {
        "flash_attn_func": 0,
        "flash_attn_varlen_func": 2,
        "flash_attn_with_kvcache": 0,
    }
    packed.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)


def test_set_attn_implementation(tiny_llama):
    model = _load(tiny_llama, "sdpa")
    ids = torch.randint(0, 101, (1, 5), device=DEVICE)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
        assert model.config._attn_implementation == ATTENTION_IMPLEMENTATION
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-4, atol=1e-4)


def test_generate_with_a_kv_cache(tiny_llama):
    # Decoding: one query over the cached keys (causal aligned to the bottom right).
    ours, sdpa = _load(tiny_llama, ATTENTION_IMPLEMENTATION), _load(tiny_llama, "sdpa")
    ids = torch.randint(0, 101, (1, 6), device=DEVICE)
    kwargs = {"max_new_tokens": 4, "do_sample": False}
    assert torch.equal(ours.generate(ids, **kwargs), sdpa.generate(ids, **kwargs))


@pytest.mark.parametrize(
    "padded,length",
    [(False, 9), (True, 9), (False, 19)],
    ids=["no-padding", "left-padded", "prompt-past-the-decode-path"],
)
def test_generate_with_a_static_cache(tiny_llama, padded, length):
    # generate() drops an all-ones padding mask for implementations not named *flash*, ours
    # among them: the static cache's keys then come without a word on which rows are filled.
    # Without the fill read from the position ids, the prompt's queries attended to the empty
    # rows (different tokens from the first one generated on).
    ours, sdpa = _load(tiny_llama, ATTENTION_IMPLEMENTATION), _load(tiny_llama, "sdpa")
    # A prompt of more than 16 tokens takes the forward kernel (the cache's fill as its key
    # lengths), a shorter one the decode path.
    ids = torch.randint(1, 101, (2, length), device=DEVICE)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0
    kwargs = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    want = sdpa.generate(ids, **kwargs)
    assert torch.equal(ours.generate(ids, cache_implementation="static", **kwargs), want)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_generate_a_padded_batch_decodes_without_unpadding(tiny_llama, calls, monkeypatch,
                                                          padding):  # fmt: skip
    # The prompt goes through the varlen path; each decode step through flash_attn_with_kvcache
    # with the padding mask read on the device (no unpadding, no host synchronisation). Left
    # padding gives SDPA's tokens. A right-padded prompt leaves holes in the mask between it
    # and the generated tokens, and flash attention's prompt differs from SDPA's there (its
    # padding rows are zeros, and generate() reads the last, a padding row): its decode steps
    # give the tokens that unpadding them (transformers' flash-attention path) gives.
    import kernels.library.attention as ours_module

    ours = _load(tiny_llama, ATTENTION_IMPLEMENTATION)
    ids = torch.randint(1, 101, (3, 7), device=DEVICE)
    mask = torch.ones_like(ids)
    pad = slice(0, 3) if padding == "left" else slice(4, 7)
    mask[0, pad] = 0
    mask[2, pad][:1] = 0
    kwargs = {"attention_mask": mask, "max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    if padding == "left":
        want = _load(tiny_llama, "sdpa").generate(ids, **kwargs)
    else:
        with monkeypatch.context() as unpadded:
            unpadded.setattr(ours_module, "padded_decode_step", lambda *args: None)
            want = ours.generate(ids, **kwargs)
    calls.update(dict.fromkeys(calls, 0))
    prepared = []
    decode_keys = ours_module._decode_keys
    monkeypatch.setattr(ours_module, "_decode_keys",
                        lambda *args: prepared.append(1) or decode_keys(*args))  # fmt: skip
    assert torch.equal(ours.generate(ids, **kwargs), want)
    layers = ours.config.num_hidden_layers
    assert calls == {"flash_attn_func": 0, "flash_attn_varlen_func": layers,
                     "flash_attn_with_kvcache": 3 * layers}  # fmt: skip
    # The key counts are taken from the mask once a decode step, not once a layer.
    assert len(prepared) == 3 < 3 * layers


@pytest.mark.parametrize("padding", ["left", "right"])
def test_a_sliding_window_counts_kept_keys_in_a_padded_decode_step(calls, monkeypatch, padding):
    # A Mistral whose window (4 tokens) is shorter than its prompts: its decode steps take
    # flash_attn_with_kvcache too, the window in the key mask, and give the unpadded path's
    # tokens (left-padded, SDPA's too). test_a_padded_decode_step_equals_unpadding checks the
    # window's arithmetic on the outputs, which a tiny model's tokens barely depend on.
    import kernels.library.attention as ours_module
    from tests.support.generation import tiny_sliding_window_mistral

    register_attention()
    model = tiny_sliding_window_mistral().to(DEVICE)
    ids = torch.randint(1, 50, (2, 8), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[0, slice(0, 3) if padding == "left" else slice(5, 8)] = 0
    kwargs = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    sdpa = model.generate(ids, **kwargs)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    with monkeypatch.context() as unpadded:
        unpadded.setattr(ours_module, "padded_decode_step", lambda *args: None)
        want = model.generate(ids, **kwargs)
    if padding == "left":
        assert torch.equal(want, sdpa)
    calls.update(dict.fromkeys(calls, 0))
    assert torch.equal(model.generate(ids, **kwargs), want)
    assert calls["flash_attn_with_kvcache"] == 4 * model.config.num_hidden_layers


@pytest.mark.parametrize("window", [None, 3], ids=["no-window", "window-3"])
def test_a_padded_decode_step_equals_unpadding(monkeypatch, window):
    # The decode step's output against the unpadded path's, with left padding, a hole (a
    # continued right-padded prompt) and a sliding window counted among the kept keys.
    from transformers.models.llama.modeling_llama import LlamaAttention

    import kernels.library.attention as ours_module

    register_attention()
    module = LlamaAttention(llama_config(hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2), layer_idx=0)  # fmt: skip
    q = torch.randn(3, 4, 1, 16, device=DEVICE)
    k, v = (torch.randn(3, 2, 12, 16, device=DEVICE) for _ in range(2))
    mask = torch.ones(3, 12, dtype=torch.bool, device=DEVICE)
    mask[0, :5] = False
    mask[1, 6:10] = False
    sliding = {} if window is None else {"sliding_window": window + 1}
    with torch.no_grad():
        got = ours_module.attention_forward(module, q, k, v, mask, scaling=0.25, **sliding)[0]
        monkeypatch.setattr(ours_module, "padded_decode_step", lambda *args: None)
        want = ours_module.attention_forward(module, q, k, v, mask, scaling=0.25, **sliding)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padded", [True, False], ids=["decode-step", "unpadded-prompt"])
def test_padded_decode_step_reads_nothing_on_the_host(padded):
    # A padded batch's decode step runs no op that reads a tensor on the host, where
    # unpadding would (nonzero, .item(): the second case, a prompt, shows the check sees them).
    from transformers.models.llama.modeling_llama import LlamaAttention

    from kernels.library.attention import attention_forward

    register_attention()
    module = LlamaAttention(llama_config(hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2), layer_idx=0)  # fmt: skip
    q = torch.randn(2, 4, 1 if padded else 9, 16, device=DEVICE)
    k, v = (torch.randn(2, 2, 9, 16, device=DEVICE) for _ in range(2))
    mask = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
    mask[0, :4] = False
    with torch.no_grad(), OpNames() as ops:
        out = attention_forward(module, q, k, v, mask, scaling=0.25)[0]
    assert bool(ops.host_reads) is not padded, sorted(ops.names)
    if padded:
        # The keys the mask leaves out do not count: the same as attending to the kept ones.
        alone = attention_forward(module, q[:1], k[:1, :, 4:], v[:1, :, 4:], None, scaling=0.25)
        torch.testing.assert_close(out[:1], alone[0], rtol=2e-3, atol=2e-3)


def test_padded_decode_step_is_taken_only_where_exact():
    from kernels.library.attention import padded_decode_step

    key = torch.zeros(2, 13, 2, 16)
    mask = torch.tensor([[0] * 3 + [1] * 8, [1] * 9 + [0, 1]])  # 11 columns: a static cache
    filled, kept = padded_decode_step(key, mask, 1, {})
    assert filled.tolist() == [11, 11] and torch.equal(kept, mask.bool())
    assert padded_decode_step(key, mask[:, :9], 1, {})[0].tolist() == [9, 9]
    assert padded_decode_step(key, torch.zeros(2, 5, dtype=torch.bool), 1, {})[0].tolist() == [0, 0]
    # A window of 3 keys to the left: the query's own and the 3 kept before it, the hole at
    # row 9 of the second sequence not counted.
    filled, kept = padded_decode_step(key, mask, 1, {"window_size": (3, 3)})
    assert filled.tolist() == [11, 11]
    assert kept.int().tolist() == [[0] * 7 + [1] * 4, [0] * 6 + [1] * 3 + [0, 1]]
    assert padded_decode_step(key, mask, 2, {}) is None  # a prompt, or several new tokens
    assert padded_decode_step(key, mask, 1, {"dropout_p": 0.1}) is None
    assert padded_decode_step(key, torch.ones(2, 14), 1, {}) is None  # longer than the keys
    with torch.enable_grad():
        assert padded_decode_step(key.requires_grad_(), mask, 1, {}) is None


def test_a_forwards_masks_keep_their_decode_keys_for_that_forward_only(monkeypatch):
    # A mask the mask function made keeps padded_decode_step's result per window until the
    # mask function runs again or the mask changes in place; any other mask is computed anew.
    import kernels.library.attention as ours_module
    from kernels.library.attention import padded_decode_step

    prepared = []
    decode_keys = ours_module._decode_keys
    monkeypatch.setattr(ours_module, "_decode_keys",
                        lambda *args: prepared.append(1) or decode_keys(*args))  # fmt: skip
    key = torch.zeros(2, 6, 2, 16)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6])
    masks = ours_module._ForwardMasks()
    monkeypatch.setattr(ours_module, "_forward_masks", masks)
    padded_decode_step(key, mask, 1, {})
    padded_decode_step(key, mask, 1, {})
    assert len(prepared) == 2  # not made by the mask function: every call computes
    masks.made(mask)
    first = padded_decode_step(key, mask, 1, {})
    assert padded_decode_step(key, mask, 1, {}) is first and len(prepared) == 3
    windowed = padded_decode_step(key, mask, 1, {"window_size": (2, 2)})
    assert windowed is not first and len(prepared) == 4
    assert padded_decode_step(key, mask, 1, {"window_size": (2, 2)}) is windowed
    assert padded_decode_step(key, mask.clone(), 1, {}) is not first and len(prepared) == 5
    masks.made(mask)  # the next forward's, the same mask unchanged: nothing is reused
    assert padded_decode_step(key, mask, 1, {}) is not first and len(prepared) == 6
    mask[0, 0] = 1  # changed in place: computed anew, with the new key
    assert padded_decode_step(key, mask, 1, {})[1].all() and len(prepared) == 7
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    padded_decode_step(key, mask, 1, {})
    assert len(prepared) == 8  # traced under torch.compile, where inductor shares it


def test_padding_mask_keeps_a_captured_decode_steps_mask_of_ones(monkeypatch):
    # Flash attention's mask function drops a mask of ones after reading it on the host; ours
    # keeps a decode step's while a CUDA graph captures it (read on the device later),
    # whichever line's keywords it gets, and is flash attention's otherwise.
    import inspect

    from transformers.masking_utils import flash_attention_mask

    import kernels.library.attention as ours_module
    from kernels.library.attention import padding_mask

    ones = torch.ones(2, 6, dtype=torch.bool)
    if "q_length" in inspect.signature(flash_attention_mask).parameters:  # 5.x
        step, prompt = {"q_length": 1}, {"q_length": 6}
    else:  # 4.57
        step, prompt = {"cache_position": torch.tensor([5])}, {"cache_position": torch.arange(6)}
    common = {"batch_size": 2, "kv_length": 6, "kv_offset": 0, "attention_mask": ones}
    assert padding_mask(**common, **step) is None  # not capturing: the host read
    monkeypatch.setattr(ours_module, "capturing", lambda: True)
    assert torch.equal(padding_mask(**common, **step), ones)
    assert padding_mask(**common, **prompt) is None
    assert padding_mask(**common | {"attention_mask": None}, **step) is None
    # A sliding window's layers see the last kv_length columns.
    assert padding_mask(**common | {"kv_length": 4}, **step).shape == (2, 4)


def test_static_cache_fill_is_read_only_where_keys_outnumber_queries():
    from kernels.library.attention import static_cache_fill

    key = torch.zeros(2, 13, 2, 16)
    positions = torch.tensor([[7], [7]])
    assert static_cache_fill(key, 1, positions, {}).tolist() == [8, 8]
    # One row of positions for the batch (unsqueezed, as models make them), and positions past
    # the cache (clamped).
    assert static_cache_fill(key, 1, torch.tensor([[20]]), {}).tolist() == [13, 13]
    assert static_cache_fill(key, 13, torch.arange(13)[None], {}) is None  # no cache
    assert static_cache_fill(key, 1, None, {}) is None
    assert static_cache_fill(key, 1, torch.zeros(3, 2, 1, dtype=torch.long), {}) is None  # mrope
    assert static_cache_fill(key, 1, positions, {"dropout_p": 0.1}) is None  # training
    with torch.enable_grad():
        assert static_cache_fill(key.requires_grad_(), 1, positions, {}) is None


def test_attention_dropout_in_training(tiny_llama):
    # transformers passes the model's attention_dropout as dropout_p in train() mode only: the
    # logits then change, repeat under the same torch seed, and eval() gives back the plain ones.
    model = _load(tiny_llama, ATTENTION_IMPLEMENTATION)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    ids = torch.randint(0, 101, (1, 9), device=DEVICE)
    model.eval()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        model.train()
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            runs.append(model(input_ids=ids).logits)
        model.eval()
        again = model(input_ids=ids).logits
    assert torch.equal(runs[0], runs[1])
    assert not torch.allclose(runs[0], plain, atol=1e-3)
    assert torch.equal(again, plain)


def test_packed_check_reads_the_position_ids_once_per_tensor(monkeypatch):
    """transformers' packed-sequence check synchronises with the device; every layer of a
    forward passes the same position_ids, so it runs once for them, and again for another
    tensor or after an in-place change."""
    from transformers import modeling_flash_attention_utils as fa

    from kernels.library.attention import is_packed_sequence

    reads = []
    original = fa._is_packed_sequence
    monkeypatch.setattr(
        fa, "_is_packed_sequence", lambda ids, batch: reads.append(ids) or original(ids, batch)
    )
    plain = torch.arange(9)[None]
    assert [is_packed_sequence(plain, 1) for _ in range(3)] == [False] * 3
    assert len(reads) == 1
    plain[0, 5:] -= 5  # two documents now: the cached answer must not be reused
    assert is_packed_sequence(plain, 1) and len(reads) == 2
    packed = torch.tensor([[0, 1, 2, 0, 1]])
    assert is_packed_sequence(packed, 1) and is_packed_sequence(packed, 1) and len(reads) == 3
    with torch.inference_mode():
        frozen = torch.arange(4)[None]
    assert not is_packed_sequence(frozen, 1) and not is_packed_sequence(frozen, 1)
    assert len(reads) == 4
    # A batch of several rows is never packed; transformers answers without reading values.
    assert not is_packed_sequence(torch.tensor([[0, 1, 0], [0, 1, 2]]), 2)
