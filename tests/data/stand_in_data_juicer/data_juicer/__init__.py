"""A stand-in for Data-Juicer (tests/test_dj_server.py): the two calls the worker makes
(`config.init_configs`, `core.DefaultExecutor(cfg).run()`) over a few ops of its own."""

__version__ = "stand-in"
