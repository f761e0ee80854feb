"""Start prefill/decode servers and the PD router from a TOML config, and supervise them.

  config.py      load and check a config (keys, types, contradictions), build each command
  check_args.py  run the configured server flags through SGLang's own parser (a subprocess)
  supervisor.py  start children in their own process groups, wait until ready, stop them all

No torch and no sglang in this process: SGLang's parser runs in a child (check_args.py).
"""
