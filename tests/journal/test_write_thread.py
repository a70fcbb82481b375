"""The compiled build's write threads (kestreld/journal/write_thread.py): a large buffer is
written whole by a thread that never takes the interpreter lock, and reported on the loop.

The write threads are C from start to close, so they exist in the compiled build only; each
test runs its scenario in a child process with the extensions on (as the server would), in
both runs of the suite.  The server's own large items go through them in
tests/frontends/memcache/test_large_items.py and the crash suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kestreld import compiled

#: What every scenario starts with: the loop, and a helper that waits for a job's report.
PRELUDE = """
import asyncio, os, sys, threading, time
from kestreld import compiled
from kestreld.journal import write_thread
from kestreld.journal.write_thread import WriteThreads

assert write_thread.COMPILED, "write_thread.py is not compiled"


async def reported(threads, fd, chunks):
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    job = threads.submit(fd, chunks, lambda: done.set_result(threading.get_ident()))
    return job, await asyncio.wait_for(done, 30)


# A thread that reads size bytes from the pipe r into got, after 0.3 s: a write waits for it.
def late_reader(r, size, got):
    def read_late():
        time.sleep(0.3)
        while sum(map(len, got)) < size:
            got.append(os.read(r, 1 << 16))
    reader = threading.Thread(target=read_late)
    reader.start()
    return reader
"""


def run_compiled(scenario: str) -> str:
    """Run ``scenario`` (after :data:`PRELUDE`) in a child with the extensions on."""
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV_VAR}
    check = "from kestreld.journal import write_thread; print(write_thread.COMPILED)"
    probe = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True, env=env
    )
    if probe.stdout.strip() != "True":
        pytest.skip("write_thread.py is not compiled in this install (no C compiler)")
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(scenario)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_buffer_is_written_whole_in_order_and_reported_on_the_loop(tmp_path):
    path = tmp_path / "segment"
    out = run_compiled(
        f"""
        # More chunks than one writev takes (IOV_MAX), of every size, 8 MiB in all.
        chunks = [bytes([i % 251]) * (i * 7 % 5000) for i in range(3000)]
        async def main():
            threads = WriteThreads(asyncio.get_running_loop())
            fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            job, thread = await reported(threads, fd, chunks)
            job.result()  # no error
            threads.close()
            print(thread == threading.get_ident())
            with open({str(path)!r}, "rb") as f:
                print(f.read() == b"".join(chunks))
        asyncio.run(main())
        """
    )
    assert out.split() == ["True", "True"]


def test_a_failed_write_is_reported_and_its_result_raises_the_errno(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"")
    out = run_compiled(
        f"""
        async def main():
            threads = WriteThreads(asyncio.get_running_loop())
            fd = os.open({str(path)!r}, os.O_RDONLY)
            job, _ = await reported(threads, fd, [b"x" * 1024])
            try:
                job.result()
            except OSError as e:
                print(e.errno == __import__("errno").EBADF)
            threads.close()
        asyncio.run(main())
        """
    )
    assert out == "True"


def test_result_blocks_until_the_thread_has_written_everything():
    out = run_compiled(
        """
        # A pipe read late: the thread's writev waits for the reader, result() for the thread.
        size = 4 << 20
        r, w = os.pipe()
        got = []
        async def main():
            threads = WriteThreads(asyncio.get_running_loop())
            reader = late_reader(r, size, got)
            started = time.monotonic()
            threads.submit(w, [b"a" * (size // 2), b"b" * (size // 2)], lambda: None).result()
            # Written: all but what the pipe holds (64 KiB) is read, after the reader's wait.
            print(time.monotonic() - started >= 0.25)
            reader.join()
            print(b"".join(got) == b"a" * (size // 2) + b"b" * (size // 2))
            threads.close()
        asyncio.run(main())
        """
    )
    assert out.split() == ["True", "True"]


def test_close_waits_for_the_jobs_handed_over_and_reports_them():
    out = run_compiled(
        """
        size = 4 << 20
        r, w = os.pipe()
        got = []
        reports = []
        async def main():
            threads = WriteThreads(asyncio.get_running_loop())
            reader = late_reader(r, size, got)
            threads.submit(w, [b"a" * size], lambda: reports.append(1))
            started = time.monotonic()
            threads.close()
            print(time.monotonic() - started >= 0.25, reports == [1])
            reader.join()
            print(sum(map(len, got)) == size)
        asyncio.run(main())
        """
    )
    assert out.split() == ["True", "True", "True"]


def test_a_write_goes_on_while_the_loop_holds_the_interpreter_lock():
    """The executor's thread needs the GIL to start and to finish a write; a write thread
    does not: with the switch interval at 100 s, a loop that computes for 2 s keeps the
    GIL, and the write still arrives (timed by another process) meanwhile."""
    out = run_compiled(
        """
        import subprocess
        size = 4 << 20
        r, w = os.pipe()
        stamp = (
            "import sys, time; print('ready', flush=True); "
            f"sys.stdin.buffer.read({size}); print(time.monotonic(), flush=True)"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", stamp], stdin=r, stdout=subprocess.PIPE, text=True
        )
        os.close(r)
        assert child.stdout.readline().strip() == "ready"
        async def main():
            threads = WriteThreads(asyncio.get_running_loop())
            await reported(threads, w, [b"warm"])  # the threads are in their C loop
            time.sleep(0.2)
            sys.setswitchinterval(100)
            threads.submit(w, [b"x" * (size - 4)], lambda: None)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:  # pure Python: the GIL is never let go
                pass
            sys.setswitchinterval(0.005)
            received = float(child.stdout.readline())
            print(received < end)
            threads.close()
        asyncio.run(main())
        """
    )
    assert out == "True"
