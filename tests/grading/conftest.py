"""Graded tests run under the judge (`ag grade`, or `python -m ag.course.judge`), never as plain
pytest: each test's check runs in the judge and asks the `worker` fixture for data that a probe
(a function marked `@probe` in a public test file) collects in a sandboxed worker from the
student's code. The judge's plugin provides `worker` and reads `points(n)` and `hidden`."""
