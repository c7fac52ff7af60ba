"""`python -m prorl_server.devllm --port P [--model GGUF] [--slots N]`."""

from prorl_server.devllm.cli import main

if __name__ == "__main__":
    main()
