#!/usr/bin/env python3
"""Writes the seed corpora, fuzz/corpus/<target>/seed-*, from the shared cases (the copies in
crates/*/tests/cases/, inputs from public bug reports), the inputs of the unit tests, and the
TOML examples of README.md. Run it again after changing a target's input layout; it removes the
old seeds of every target first (files named seed-*; a minimised crash kept as regression-*
stays). See docs/fuzzing.md for each target's input layout.
"""

import json
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEP = b"\x1f"


def case(name):
    for crate in ("sessionbox-core", "sessionbox-egress", "sessionbox-opensandbox"):
        p = os.path.join(ROOT, "crates", crate, "tests", "cases", name)
        if os.path.exists(p):
            return json.load(open(p))
    sys.exit("missing shared case file " + name)


def b(s):
    return s.encode() if isinstance(s, str) else s


def ids():
    c = case("conversation-ids.json")
    out = [v for v in c["valid"]] + [i["id"] for i in c["invalid"]]
    out += ["acme" + "\x1f" + "c1", "ab\x1fc", "a\x1fbc", "t" * 65 + "\x1fx"]
    key = "494b61c43c470497f34402cf4c15d9605eb723b68bb55e3178470f68913db0b6"
    out += [key, key.upper(), "../x"]
    return [b(x) for x in out]


def workspace_path():
    c = case("workspace-paths.json")
    paths = [x["path"] for x in c["cases"]] + [x["cwd"] for x in c["exec_cwd_cases"]]
    # The symlink cases, as paths into the fuzz fixture's links.
    paths += ["leak", "r/etc/hostname", "r/etc/passwd", "up/outside.txt", "a/up/ws-evil/secret.txt",
              "in/b/c.txt", "loop", "/workspace/a/../a/b", "/workspace/./a//b", "/workspace/"]
    out = [bytes([0]) + b(p) for p in paths]
    # Other roots (flags pick ROOTS[flags % 5]) and `~` expansion (0x80).
    out += [bytes([1]) + b"/etc/passwd", bytes([2]) + b"/data/workspaces/ab12/x",
            bytes([3]) + b"/workspace-evil/x", bytes([0x80]) + b"~/a/b",
            bytes([0x80]) + b"~/../x", bytes([0x80]) + b"~", bytes([0x81]) + b"~"]
    return out


def patterns():
    def req(flags, pattern, glob="", path=""):
        return bytes([flags]) + b(pattern) + SEP + b(glob) + SEP + b(path)
    return [
        req(0, "src/**/*.rs"), req(0, "../*"), req(0, "fn ("), req(0, "/workspace/./a//*.rs"),
        req(0, "a["), req(0, "/etc/*"), req(0, "**/*"), req(0, "*"), req(0, "/workspace"),
        req(1, "FN"), req(2, "fn", "**/*.rs"), req(4, "fn", "", "src"), req(6, "x", "../x", "/elsewhere"),
        req(4, "OUTSIDE", "", "leak"), req(4, "root", "", "r/etc"), req(0, "up/*"), req(0, "{a,b}/**"),
        req(0, "a/\\*"), req(0, "(?i)MAIN"),
    ]


def egress():
    c = case("egress-targets.json")
    lines = [t["host"] for t in c["targets"]]
    lines += [t["host"] + ":443" for t in c["targets"]]
    lines += ["CONNECT", "http://" + c["targets"][1]["host"] + "/latest/meta-data/"]
    for m in c["allowlist_matching"]:
        lines += [m["allow"], m["host"]]
    lines += ["*.pypi.org:443", "10.1.0.0/16", "evil.pypi.org", "[2001:db8::1]:80,443",
              "192.0.2.7:8000-8100", "2001:db8::/32", "[2001:db8::/32]:443", "0.0.0.0/0", "::/0",
              "localhost", "a.localhost", "API.Example.com", "bücher.example", "1.2.3.4.5",
              "0x7F000001", "0177.0.0.1", "[::1]:80", "user@allowed.example:443",
              "http://user@127.0.0.1/", "http://[::ffff:7f00:1]:80/x"]
    # The structured part (a blocked address and its spelling) first; zeros pick the first
    # choices. Then the lines.
    return [bytes(48) + b"\n" + b("\n".join(lines[i:i + 8])) for i in range(0, len(lines), 8)]


def endpoint():
    c = case("endpoint-urls.json")
    out = []
    for x in c["cases"]:
        out.append(bytes([0]) + b(x["endpoint"]) + SEP + b(c["sandbox_id"]))
    for h in c["headers"]:
        port = 0 if h["port"] == 44772 else 1
        for k, v in h["returned"].items():
            ep = "127.0.0.1:8080/v1/sandboxes/%s/proxy/%d" % (c["sandbox_id"], h["port"])
            out.append(bytes([port << 2]) + b(ep) + SEP + b(c["sandbox_id"]) + SEP + b(k) + SEP + b(v))
    # Direct endpoints (0x10), with the lifecycle host trusted (0x20).
    for ep in ["http://172.17.0.3:44772", "http://172.17.0.3:44772/proxy/44772",
               "http://sandbox-host.example:44772/", "http://evil.example:44772",
               "http://172.18.0.3:44772", "http://[fd00::5]:44772", "http://10.0.0.5"]:
        out.append(bytes([0x10]) + b(ep))
    out.append(bytes([0x30]) + b"http://127.0.0.1:9999")
    out.append(bytes([0]) + b"http://127.0.0.1:8080/v1/sandboxes/abc/proxy/44772/%2e%2e/x" + SEP + b"abc")
    return out


UPSTREAM = (
    b'{"type":"init","text":"cmd-1","timestamp":1}\n\n'
    b'{"type":"stdout","text":"h\xc3\xa9llo\\n","timestamp":2}\n\n'
    b'{"type":"ping","text":"pong","timestamp":3}\n\n'
    b'{"type":"stderr","text":"oops\\n","timestamp":4}\n\n'
    b'{"type":"execution_complete","execution_time":12,"timestamp":5}\n\n'
)


def event_stream():
    sse = b"".join(b"data: " + e + b"\n\n" for e in UPSTREAM.split(b"\n\n") if e)
    comments = (b": keep-alive\nretry: 3000\n\nevent: stdout\nid: 1\n"
                b'data: {"type":"stdout","text":"a"}\n\n:\n\nevent: done\n\n'
                b'data: {"type":"error","error":{"ename":"CommandExecError","evalue":"2"}}\n\n')
    multi = (b'data: {"type":"stdout",\ndata:  "text":"x"}\n\n'
             b'{\n  "type": "execution_complete",\n  "execution_time": 1\n}\n\n')
    bom = b"\xef\xbb\xbf" + UPSTREAM.replace(b"\n\n", b"\n \t\n")
    crlf = b"".join(b"data:" + e + b"\r\n\r\n" for e in UPSTREAM.split(b"\n\n") if e)

    def cuts(*at):
        return bytes([len(at)]) + b"".join(struct.pack("<H", a) for a in at)
    return [
        bytes([0]) + UPSTREAM, bytes([0]) + sse, bytes([0]) + comments, bytes([0]) + multi,
        bytes([0]) + bom, cuts(3, 60, 61) + crlf, cuts(1, 2, 3, 4) + UPSTREAM,
        bytes([0]) + UPSTREAM[:-10], bytes([0]) + b'data: {"text":"no type"}\n\n',
        bytes([8]) + b"x" * 300, bytes([8]) + b": " + b"c" * 300 + b"\n" + UPSTREAM,
        bytes([0]) + UPSTREAM + b'{"type":"stdout","text":"late"}\n\nnot json \x00 {{\n\n',
    ]


def upload():
    body = (b"--BND\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n"
            b"Content-Type: application/json\r\n\r\n"
            b"{\"path\": \"/w/dir/a.txt\", \"owner\": null, \"group\": null, \"mode\": 755}\r\n"
            b"--BND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\nhello\r\n--BND--\r\n")
    ct = b"multipart/form-data; boundary=BND"
    return [
        bytes([0]) + ct + SEP + body,
        bytes([0]) + ct + SEP + body.replace(b'name="file"', b'name="other"'),
        bytes([0]) + ct + SEP + body[: len(body) // 2],
        bytes([0]) + b"text/plain" + SEP + body,
        bytes([0]) + b'multipart/form-data; boundary="a b"' + SEP + b"--a b\r\n\r\n--a b--\r\n",
        bytes([1]) + b"/w/dir/a.txt" + SEP + SEP + b"hello",
        bytes([1]) + b'/w/b".bin' + SEP + b"root" + SEP + bytes([0, 255, 13, 10]),
        bytes([1]) + "/w/é😀\t\x7f\"\\".encode() + SEP + SEP + b"--BND\r\n" + SEP + b"/w/2" + SEP + SEP + b"x",
    ]


def skill_md():
    return [b(x) for x in [
        "---\nname: pdf-tools\ndescription: Fill PDF forms.\n---\n# PDF\nRun scripts/fill.py.\n",
        "---\nname: a\ndescription: >\n  Does a.\nmetadata:\n  sessionbox-bootstrap: touch x\n  author: me\nversion: 3\n---\nbody\n",
        "name: a\n", "---\nname: a\ndescription: d\n", "---\ndescription: d\n---\n",
        "---\nname: a\n---\n", "---\nname: a\ndescription: ''\n---\n", "---\nname: A\ndescription: d\n---\n",
        "---\nname: [a\n---\n", "---\nname: a\ndescription: d\nmetadata: 3\n---\n",
        "\ufeff---\r\nname: x-1\r\ndescription: \"quoted: yes\"\r\nlicense: MIT\r\ncompatibility: linux\r\nallowed-tools: Bash\r\n---\r\n",
        "---\nname: a\ndescription: |\n  line one\n  ---\n  line three\n---\n---\nbody with a rule\n",
        "---\nname: &n a\ndescription: *n\n---\n",
    ]]


def config():
    readme = open(os.path.join(ROOT, "README.md")).read()
    out = []
    for block in re.findall(r"```toml\n(.*?)```", readme, re.S):
        lines = block.splitlines()
        indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
        out.append("\n".join(l[indent:] for l in lines) + "\n")
    out += [
        "runtme = \"host\"\n", "[serve]\nmax_output_bytes = 1\n",
        "[opensandbox]\npool_size = 2\n[opensandbox.pool_tenants]\nacme = 5\nquiet = 0\n",
        "[store]\nurl = \"postgres://sessionbox:hunter2-secret@db.example:5432/sessionbox\"\n",
        "store = \"postgres://sessionbox:hunter2-secret@db.example:5432/sessionbox\"\n",
        "[isolated]\npids = \"hunter2-secret\"\n", "runtime = \"hunter2-secret\"\n",
        "[lifecycle.tenants.\"bad tenant\"]\nttl_secs = 1\n",
        "[egress]\nnameservers = [\"192.0.2.53:53\", \"not-an-address-1\"]\n",
        "[isolated]\ndisk_bytes = 1\n", "[skills.tenants]\ndefault = [\"relative/dir\"]\n",
    ]
    return [b(x) for x in out]


def pty():
    def frame(mode, f):
        return bytes([mode]) + b(f)
    return [
        frame(0, b"\x03\x00\x00\x00\x00\x00\x00\x00\x07ab"), frame(0, b"\x03\x01"),
        frame(0, b"\x01hello"), frame(0, b"\x02err"), frame(0, b"\x00ls\r"),
        frame(0, '{"type":"resize","cols":120,"rows":40}'), frame(0, '{"type":"resize","cols":70000,"rows":40}'),
        frame(0, '{"type":"signal","signal":"SIGINT"}'), frame(0, '{"type":"ping"}'),
        frame(0, '{"type":"stdin","data":"echo hi\\n"}'), frame(0, '{"type":"exit","exit_code":0}'),
        frame(0, '{"type":"connected","session_id":"s1","mode":"pty"}'),
        frame(0, '{"type":"error","code":"SESSION_GONE","error":"gone"}'), frame(1, b"\x78\x00\x28\x00"),
    ]


TARGETS = {
    "ids": ids, "workspace_path": workspace_path, "patterns": patterns, "egress": egress,
    "endpoint": endpoint, "event_stream": event_stream, "upload": upload, "skill_md": skill_md,
    "config": config, "pty": pty,
}

if __name__ == "__main__":
    for name, make in TARGETS.items():
        d = os.path.join(ROOT, "fuzz", "corpus", name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.remove(os.path.join(d, f))
        seeds = make()
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed-%03d" % i), "wb") as f:
                f.write(s)
        print("%-15s %3d seeds, %5d bytes" % (name, len(seeds), sum(len(s) for s in seeds)))
