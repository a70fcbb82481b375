"""The pingpong client in C: one request at a time, with no interpreter between two requests.

``python scripts/lab/pingpong.py --client c`` runs the same loop as its Python client
(``send`` the request, ``recv`` to the end of the reply, send the next) from a small C
program, so the gap a server sees between its reply and the next request is the
client's wake-up and nothing more: the client of a compiled load generator (memtier,
a C or Java service) rather than of a Python one.  The program is compiled from
:data:`SOURCE` with the machine's C compiler when a run asks for it (``cc``, or ``CC``);
kestreld itself never needs one.

The protocol between the two: ``client PORT OP SECONDS PREFILL`` connects, stores
``PREFILL`` 1 KiB items (in batches, for ``get`` and ``rget``), sends 1,000 requests to
warm up, prints ``ready`` and waits for a line on its standard input; then it runs ``OP``
for ``SECONDS`` and prints how many requests it made.  A reply it does not expect (a get
without an item: the prefill ran dry) ends it with status 2 and the reply on stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

#: The ops it runs: ``set q``, ``get q`` and ``get q/close/open`` (a reliable read).
OPS = ("set", "get", "rget")

SOURCE = r"""
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#define SIZE 1024
#define BATCH 100

static int fd;
static char reply[1 << 20];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void send_all(const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { perror("send"); exit(1); }
        p += w; n -= (size_t)w;
    }
}

/* Send a request, read to the end of its reply (which ends with `end`): its length. */
static size_t exchange(const char *req, size_t len, const char *end, size_t end_len) {
    size_t got = 0;
    send_all(req, len);
    for (;;) {
        ssize_t r = recv(fd, reply + got, sizeof reply - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { fprintf(stderr, "the server closed the connection\n"); exit(1); }
        got += (size_t)r;
        if (got >= end_len && memcmp(reply + got - end_len, end, end_len) == 0) return got;
        if (got == sizeof reply) { fprintf(stderr, "reply too long\n"); exit(1); }
    }
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: client PORT set|get|rget SECONDS PREFILL\n"); return 1; }
    int port = atoi(argv[1]);
    const char *op = argv[2];
    double seconds = atof(argv[3]);
    long prefill = atol(argv[4]);

    fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { perror("connect"); return 1; }

    static char set[64 + SIZE];
    size_t set_len = (size_t)sprintf(set, "set q 0 0 %d\r\n", SIZE);
    memset(set + set_len, 'x', SIZE);
    set_len += SIZE;
    memcpy(set + set_len, "\r\n", 2);
    set_len += 2;

    const char *req = set, *end = "STORED\r\n";
    size_t req_len = set_len;
    int wants_value = 0;
    if (strcmp(op, "set") != 0) {
        static char batch[BATCH * sizeof set], stored[BATCH * 8 + 1];
        for (int i = 0; i < BATCH; i++) {
            memcpy(batch + i * set_len, set, set_len);
            memcpy(stored + i * 8, "STORED\r\n", 8);
        }
        for (long i = 0; i < prefill; i += BATCH) exchange(batch, BATCH * set_len, stored, BATCH * 8);
        req = strcmp(op, "get") == 0 ? "get q\r\n" : "get q/close/open\r\n";
        req_len = strlen(req);
        end = "END\r\n";
        wants_value = 1;
    }
    size_t end_len = strlen(end);
    for (int i = 0; i < 1000; i++) exchange(req, req_len, end, end_len);

    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;

    long n = 0;
    double started = now();
    while (now() - started < seconds) {
        for (int i = 0; i < 500; i++) {
            size_t got = exchange(req, req_len, end, end_len);
            if (wants_value && memcmp(reply, "VALUE ", 6) != 0) {
                fprintf(stderr, "%s: no item: %.*s\n", op, (int)got, reply);
                return 2;
            }
        }
        n += 500;
    }
    printf("%ld\n", n);
    fflush(stdout);
    return 0;
}
"""


def compiler() -> str | None:
    """The C compiler a run would use (``CC``, else ``cc`` or ``gcc`` on the PATH)."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def build(directory: Path) -> Path:
    """Compile the client into ``directory``: the program's path."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("the C client needs a C compiler (cc, gcc, or CC=...) on the PATH")
    source = directory / "pingpong_client.c"
    source.write_text(SOURCE)
    program = directory / "pingpong_client"
    done = subprocess.run(
        [cc, "-O2", "-o", str(program), str(source)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling the C client failed:\n{done.stderr}")
    return program


class TightClient:
    """One run of the compiled client against a server, started and stopped by its caller.

    :meth:`start` connects, prefills and warms up; :meth:`run` measures (the caller reads
    the server's CPU around it) and returns the number of requests made.
    """

    def __init__(self, program: Path, port: int, op: str, seconds: float, prefill: int) -> None:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (one of {', '.join(OPS)})")
        self.args = [str(program), str(port), op, repr(seconds), str(prefill)]
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            self._failed()

    def run(self) -> int:
        process = self.process
        assert process is not None, "start() first"
        process.stdin.write("go\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line.strip().isdigit():
            self._failed()
        process.wait()
        return int(line)

    def _failed(self) -> None:
        process = self.process
        assert process is not None
        process.kill()
        _, err = process.communicate()
        raise RuntimeError(f"the C client failed (status {process.returncode}): {err.strip()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
