"""Operator tools: the `ftplane` command line, its HTTP client, the demo and the dev server.

Not part of the HTTP service: this package may import api/ and workers/, and neither imports it.
"""
