"""One line for an error that comes back from Spark: the Python exception a worker raised, else the first line.

A Python exception raised in a UDF or a data source writer reaches the driver
wrapped in a Java exception whose text holds the worker's traceback, a Java
stack trace, and often both twice ("Driver stacktrace:", "Caused by:"). Its
first line says only "An exception was thrown from the Python worker:" or
"An error occurred while calling o164.save.". The CLI prints
:func:`error_line` instead (``--verbose`` prints the whole text). The text is
the same on classic (Py4J) and Spark Connect sessions, and so is the parsing.
Pure module: standard library only.
"""

from __future__ import annotations

import re

__all__ = ["error_line", "is_spark_error", "python_error_line"]

_TRACEBACK = "Traceback (most recent call last):"
# "pipeline.errors.ModelError: message" / "ValueError: message" / "KeyboardInterrupt"
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")
# lines that only wrap the real message
_WRAPPERS = ("An error occurred while calling", "An exception was thrown from the Python worker")


def python_error_line(text: str) -> str | None:
    """``Class: message`` of the last Python exception whose traceback is in ``text``; None if there is none.

    The class is given without its module; the message is its first line.

    >>> python_error_line('''org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was \\
    ... thrown from the Python worker: Traceback (most recent call last):
    ...   File "/w/pipeline/core/faults.py", line 92, in on_task_start
    ...     raise InjectedFaultError(f"injected inference failure")
    ... pipeline.errors.InjectedFaultError: injected inference failure in partition 1
    ...  SQLSTATE: 38000
    ... \\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:665)''')
    'InjectedFaultError: injected inference failure in partition 1'
    >>> python_error_line("java.io.FileNotFoundException: /x") is None
    True
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK)]
    for start in reversed(starts):
        for line in lines[start + 1:]:
            if not line.strip() or line[:1] in (" ", "\t"):  # frames, source lines, ^^^ markers
                continue
            match = _EXCEPTION.fullmatch(line.strip())
            if match is None:
                break
            name = match.group(1).rsplit(".", 1)[-1]
            message = (match.group(2) or "").strip()
            return f"{name}: {message}" if message else name
    return None


def error_line(exc: BaseException | str) -> str:
    """One line for ``exc``: the worker's Python exception when its text holds one, else its first real line.

    >>> error_line("An error occurred while calling o164.save.\\n: java.lang.IllegalStateException: bad state")
    'java.lang.IllegalStateException: bad state'
    >>> error_line(ValueError("plain"))
    'plain'
    """
    text = exc if isinstance(exc, str) else str(exc)
    found = python_error_line(text)
    if found:
        return found
    for line in text.strip().splitlines():
        line = line.strip().removeprefix(": ").strip()
        if line and not line.startswith(_WRAPPERS):
            return line
    return type(exc).__name__ if isinstance(exc, BaseException) else "unknown error"


def is_spark_error(exc: BaseException) -> bool:
    """Whether ``exc`` came out of Spark (Py4J, a captured JVM error, or a Spark Connect error), not our code."""
    for cls in type(exc).__mro__:
        module = cls.__module__ or ""
        if module.startswith(("py4j.", "pyspark.errors", "pyspark.sql.connect", "grpc")):
            return True
    return False
