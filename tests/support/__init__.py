"""Helpers shared by the test suites and the benchmarks: waiting on a condition (`waiting`), a real
Celery worker process (`processes`), and a fake HTTP receiver for webhooks (`receivers`)."""
