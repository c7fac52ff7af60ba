"""In-sandbox execution server (standard library + ptyprocess; IPython optional) and its host client."""
