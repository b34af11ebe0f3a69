"""What the tests share: tiny models, reference helpers, the Hub test session, the distributed
harness. Test modules import it as ``tests.support.<module>``: pytest puts the repository root
on ``sys.path`` (``tests`` is a package), and child processes get it through PYTHONPATH
(`tests.support.paths.subprocess_env`).
"""
