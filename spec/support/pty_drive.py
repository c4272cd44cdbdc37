#!/usr/bin/env python3
"""pty_drive.py: runs a command under a pseudo-terminal and plays a script
of keys against it, for the REPL's specs (spec/repl_spec.lua).

usage: pty_drive.py SCRIPT -- command args...
SCRIPT lines:  send <text>     keys to type (\\r, \\t, \\x03, \\x1b[A escapes)
               expect <text>   wait (10 s at most) until the output since the
                               last expect holds text; exit 3 if it never does
               sleep <seconds>
               eof             close the terminal's input (Ctrl-D)
               hangup          close the terminal (its session leader gets SIGHUP)
Prints the whole transcript, then "@@status=N" (the command's exit status)."""
import os, pty, select, signal, sys, time, codecs

def main():
    script, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    pid, fd = pty.fork()
    if pid == 0:
        # a terminal's session starts with the default signal actions; a
        # suite run under nohup or as a background job inherits SIGHUP,
        # SIGINT and SIGQUIT ignored, which the REPL would rightly keep
        for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
            signal.signal(s, signal.SIG_DFL)
        os.execvp(cmd[0], cmd)
    out, mark = b"", 0

    def pump(timeout):
        """reads what is there; False at the end of output, None when quiet"""
        nonlocal out
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return None
        try:
            data = os.read(fd, 4096)
        except OSError:
            return False
        if not data:
            return False
        out += data
        return True

    ok = True
    for line in open(script).read().splitlines():
        if os.environ.get("PTY_DEBUG"): sys.stderr.write("step %r\n" % line)
        op, _, arg = line.partition(" ")
        arg = codecs.decode(arg, "unicode_escape").encode("latin-1")
        if op == "send":
            for b in arg:   # one key at a time, as a person types
                os.write(fd, bytes([b]))
                time.sleep(0.01)
        elif op == "expect":
            end = time.time() + 10
            while arg not in out[mark:] and time.time() < end:
                if pump(0.1) is False:
                    break
            if arg not in out[mark:]:
                sys.stdout.write(out.decode("utf-8", "replace"))
                sys.stdout.write("\n@@expected %r, not found\n" % arg)
                ok = False
                break
            mark = out.index(arg, mark) + len(arg)
        elif op == "sleep":
            end = time.time() + float(arg)
            while time.time() < end:
                pump(0.05)
        elif op == "eof":
            os.write(fd, b"\x04")
        elif op == "hangup":
            os.close(fd)
            fd = None
    end, status = time.time() + 10, None
    while time.time() < end:   # the command ends (or is killed after 10 s)
        if fd is not None:
            pump(0.05)
        else:
            time.sleep(0.05)
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid:
            status = st
            break
    while fd is not None and pump(0.05):
        pass
    if status is None:   # hang up first (loomrun then ends its ranks), then kill
        if fd is not None:
            os.close(fd)
            fd = None
        end = time.time() + 5
        while status is None and time.time() < end:
            time.sleep(0.05)
            wpid, st = os.waitpid(pid, os.WNOHANG)
            if wpid:
                status = st
        if status is None:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
    if ok:
        sys.stdout.write(out.decode("utf-8", "replace"))
    sys.stdout.write("\n@@status=%d\n" % (os.waitstatus_to_exitcode(status)))
    sys.exit(0 if ok else 3)

main()
