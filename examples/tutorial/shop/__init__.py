"""The shop of unilog's tutorial (docs/tutorial.md): an API that takes orders, and a consumer that counts sales."""
