"""A real tern process on loopback whose output is collected (the server tests' and the router tests' one
process wrapper). It is ready when a line matches `ready` (group 1 the model, group 2 the URL); a
"listening on URL" line is kept too (roles that listen before they are ready).
"""
import re
import signal
import subprocess
import threading

LISTENING = re.compile(r"listening on (http://[^\s;]+)")


class TernProcess:
    def __init__(self, argv, ready, env=None, wait=True, timeout=600, preexec=None):
        self.args = list(argv)
        self.ready_re = ready
        # preexec: run in the child before exec (e.g. to lower its file limit)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, preexec_fn=preexec)
        self.lines = []
        self.url = self.model = self.listen_url = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if wait:
            self.wait_ready(timeout)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = LISTENING.search(line)
            if m and not self.listen_url:
                self.listen_url = m.group(1)
            m = self.ready_re.search(line)
            if m and not self.url:
                self.model, self.url = m.group(1), m.group(2).rstrip(",")
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout=600):
        self._ready.wait(timeout)
        assert self.url, f"{self.args} did not become ready:\n" + self.log()

    def log(self):
        return "".join(self.lines)

    @property
    def port(self):
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
