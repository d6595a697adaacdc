"""Test helpers shared by every test folder: isolated environments for subprocesses, one way to wait for a
condition, and the scaffolding (synthetic traces, a slow probe) that the product itself does not need."""
