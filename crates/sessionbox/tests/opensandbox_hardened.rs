//! The hardened `opensandbox` runtime on the real OpenSandbox 1.1.1 server, through the real
//! `sessionbox` binary: commands run unprivileged on a root they cannot write, and with
//! `[opensandbox] disk_bytes` each conversation's `/workspace` and `/tmp` are a volume of that
//! size on this host (the server allows `OPEN_SANDBOX_VOLUMES_ROOT`, as scripts/opensandbox-up
//! configures it).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use crate::egress::opensandbox_server;

const EXE: &str = env!("CARGO_BIN_EXE_sessionbox");

struct Osb {
    _dir: tempfile::TempDir,
    data: PathBuf,
    volumes: PathBuf,
}

impl Osb {
    fn new(test: &str, disk_bytes: u64) -> Osb {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let root = std::env::var("OPEN_SANDBOX_VOLUMES_ROOT")
            .unwrap_or_else(|_| "/var/lib/sessionbox/opensandbox-volumes".into());
        let volumes = PathBuf::from(root).join(format!("t{}-{test}", std::process::id()));
        std::fs::write(
            data.join("sessionbox.toml"),
            format!(
                "[opensandbox]\nmemory = \"256Mi\"\ntimeout_secs = 300\ninstance = \"t{}-{test}\"\n\
                 disk_bytes = {disk_bytes}\ndisk_inodes = 2000\nvolumes_dir = \"{}\"\n",
                std::process::id(),
                volumes.display()
            ),
        )
        .unwrap();
        Osb {
            _dir: dir,
            data,
            volumes,
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(EXE)
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--runtime", "opensandbox"])
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs `cmd` in `conv`; (exit code, stdout + stderr).
    fn sh(&self, conv: &str, cmd: &str) -> (i32, String) {
        let out = self.cli(&["exec", "-c", conv, "--timeout", "60", "--", cmd]);
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

fn image_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    // Blocks really taken on the host (the image is sparse).
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

/// Commands (and the container's main process) run as uid 1000 with no capability in any set,
/// `no_new_privs` and seccomp, and cannot write the root file system (a world-writable directory outside `/workspace` and
/// `/tmp` included: that is Landlock, not only file modes).
#[test]
fn commands_run_unprivileged_on_a_root_they_cannot_write() {
    if !opensandbox_server() {
        return;
    }
    let o = Osb::new("unpriv", 0);
    let (code, out) = o.sh(
        "unpriv",
        "id -u; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; \
         for p in /etc/x /x /usr/x /opt/opensandbox/x; do touch $p 2>/dev/null && echo wrote $p; done; \
         touch /workspace/ok /tmp/ok && echo writable; \
         grep -E '^(Uid|CapEff):' /proc/1/status | tr '\\t' ' '",
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1000", "{out}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            out.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {out}"
        );
    }
    assert!(
        out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"),
        "{out}"
    );
    assert!(!out.contains("wrote"), "{out}");
    assert!(out.contains("writable"), "{out}");
    // Not even the container's main process keeps root.
    assert!(out.contains("Uid: 1000 1000 1000 1000"), "{out}");
    assert!(out.contains("CapEff: 0000000000000000\n"), "{out}");
    o.cli(&["destroy", "-c", "unpriv"]);
}

/// Attack: a conversation writes until its disk is full, in `/workspace` and `/tmp`, by
/// command and through the agent's file API. Each stops at the quota with `ENOSPC`; the host
/// gives at most the quota (the sparse image's blocks); a second conversation still writes;
/// the files survive their sandbox being deleted behind sessionbox's back (the next call gets
/// a new sandbox with the same volume); destroy unmounts and removes the volume.
#[test]
fn a_conversation_that_fills_its_disk_stops_at_its_quota_and_another_still_writes() {
    if !opensandbox_server() {
        return;
    }
    let quota: u64 = 32 << 20;
    let o = Arc::new(Osb::new("disk", quota));
    let (code, out) = o.sh(
        "fill",
        "echo keep > /workspace/keep; \
         dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1 | grep 'No space'; \
         dd if=/dev/zero of=/tmp/big bs=1M count=8 2>&1 | grep 'No space'; \
         rm /workspace/big /tmp/big; \
         i=0; while [ $i -lt 3000 ] && touch /workspace/f$i 2>/dev/null; do i=$((i+1)); done; echo files=$i",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.matches("No space left on device").count(),
        2,
        "both writes stop at the quota: {out}"
    );
    let files: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("files="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // 2000 inodes asked; ext4 rounds up to whole inode tables (here 2048, the volume's root,
    // workspace/, tmp/ and ext4's own among them): the loop of 3000 stops there.
    assert!(
        (1900..=2048).contains(&files),
        "the inode quota did not hold: {files} files"
    );
    // Through the agent's file API too.
    let mut w = Command::new(EXE)
        .arg("--data-dir")
        .arg(&o.data)
        .args(["--runtime", "opensandbox", "write", "-c", "fill", "api.bin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let _ = w.stdin.take().unwrap().write_all(&vec![7u8; 4 << 20]);
    }
    let w = w.wait_with_output().unwrap();
    assert!(
        !w.status.success(),
        "a write past the quota through the API succeeded"
    );
    let image = o.volumes.join(format!("{}.img", key_of(&o, "fill")));
    let taken = image_bytes(&image);
    assert!(
        taken > 0 && taken <= quota,
        "the host gave {taken} bytes for a {quota}-byte quota"
    );

    // Another conversation is not touched.
    let (code, out) = o.sh(
        "other",
        "dd if=/dev/zero of=/workspace/x bs=1M count=4 2>&1 | tail -1; cat /workspace/keep 2>&1",
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("4+0 records out"), "{out}");
    assert!(
        out.contains("No such file"),
        "the other conversation sees fill's file: {out}"
    );

    // The sandbox deleted behind sessionbox's back: the next call gets a new one, files kept.
    let json = o.cli(&["conversations", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(list.to_string().contains("fill"), "{list}");
    let id = sandbox_of(&o, "fill");
    let del = Command::new("docker")
        .args(["rm", "-f", &format!("sandbox-{id}")])
        .output()
        .unwrap();
    assert!(del.status.success());
    let (code, out) = o.sh("fill", "cat /workspace/keep");
    assert_eq!((code, out.lines().next()), (0, Some("keep")), "{out}");
    assert!(out.contains("files are kept"), "{out}");

    for c in ["fill", "other"] {
        let d = o.cli(&["destroy", "-c", c]);
        assert!(d.status.success(), "{}", String::from_utf8_lossy(&d.stderr));
    }
    assert!(!image.exists(), "destroy left the volume's image");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(o.volumes.to_str().unwrap()),
        "destroy left a mount"
    );
    let _ = std::fs::remove_dir_all(&o.volumes);
}

/// The conversation key of `conv` (the default tenant), as `conversations --json` shows it.
fn key_of(o: &Osb, conv: &str) -> String {
    use sha2::Digest;
    let _ = o;
    let mut h = sha2::Sha256::new();
    h.update(format!("default\n{conv}"));
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The OpenSandbox sandbox id the store maps `conv` to (from the server's list, by label).
fn sandbox_of(o: &Osb, conv: &str) -> String {
    let key = key_of(o, conv);
    let out = Command::new("docker")
        .args([
            "ps",
            "--filter",
            &format!("label=sessionbox.conversation={}", &key[..62]),
            "--format",
            "{{.Names}}",
        ])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&out.stdout);
    names
        .lines()
        .find_map(|n| {
            n.strip_prefix("sandbox-")
                .filter(|n| !n.starts_with("egress-"))
        })
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no sandbox for {conv}: {names}"))
}

/// Attack: a command in conversation B calls conversation A's agent directly, on A's
/// container address on the Docker bridge (its execd port, no token), to read A's file and
/// run a command there. The agent answers 401 without A's token, which only sessionbox holds
/// (the command does not have it, not even in its environment), so A's file stays unread and
/// A's workspace unchanged.
#[test]
fn a_command_cannot_use_another_conversations_agent_over_the_bridge() {
    if !opensandbox_server() {
        return;
    }
    let o = Osb::new("agent-token", 0);
    let (code, out) = o.sh(
        "victim",
        "echo secret-of-a > /workspace/secret; env | grep -c EXECD_ACCESS_TOKEN",
    );
    assert_eq!(
        out.lines().next(),
        Some("0"),
        "the command sees the agent's token: {out}"
    );
    let _ = code;
    let id = sandbox_of(&o, "victim");
    let ip = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.NetworkSettings.IPAddress}}",
            &format!("sandbox-{id}"),
        ])
        .output()
        .unwrap();
    let ip = String::from_utf8_lossy(&ip.stdout).trim().to_owned();
    assert!(ip.starts_with("172."), "{ip}");
    let (code, out) = o.sh(
        "attacker",
        &format!(
            "(printf 'GET /files/download?path=/workspace/secret HTTP/1.0\\r\\n\\r\\n'; sleep 2) | nc -w 5 {ip} 44772; \
             (printf 'POST /command HTTP/1.0\\r\\nContent-Type: application/json\\r\\nContent-Length: 54\\r\\n\\r\\n{{\"command\":\"echo pwned > /workspace/from-b\",\"cwd\":\"/\"}}'; sleep 2) | nc -w 5 {ip} 44772"
        ),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.matches("401").count() >= 2,
        "the agent did not refuse the requests without a token: {out}"
    );
    assert!(!out.contains("secret-of-a"), "B read A's file: {out}");
    let (_, out) = o.sh("victim", "ls /workspace");
    assert!(!out.contains("from-b"), "B ran a command in A: {out}");
    for c in ["victim", "attacker"] {
        o.cli(&["destroy", "-c", c]);
    }
}

/// Attack: a conversation's commands leave orphans (a child whose parent exits first, as
/// every `(cmd &)` does), 600 of them, more than the server's PIDs limit (512). Each orphan
/// goes to the container's PID 1, which must reap it: with a PID 1 that never waits (the
/// default `tail -f /dev/null`), each would stay a zombie holding a process id until the
/// sandbox ends, and the conversation could never start a process again. After the attack no
/// zombie is left in the sandbox or added on the host, the conversation still runs commands,
/// and a second conversation is untouched.
#[test]
fn orphans_of_a_conversations_commands_are_reaped_and_do_not_use_up_its_pids() {
    if !opensandbox_server() {
        return;
    }
    let host_zombies = || {
        let out = Command::new("ps").args(["-eo", "stat="]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|s| s.starts_with('Z'))
            .count()
    };
    let o = Osb::new("reap", 0);
    let (code, out) = o.sh("bystander", "echo up");
    assert_eq!((code, out.trim()), (0, "up"));
    let before = host_zombies();
    let zombies = "z=0; for f in /proc/[0-9]*/stat; do \
                   [ \"$(cut -d' ' -f3 $f 2>/dev/null)\" = Z ] && z=$((z+1)); done; echo zombies=$z";
    let (code, out) = o.sh(
        "orphans",
        &format!(
            "i=0; while [ $i -lt 600 ]; do (true &) || {{ echo fork-failed-at=$i; break; }}; \
             i=$((i+1)); done; echo made=$i; sleep 1; {zombies}; \
             echo pid1=$(cat /proc/1/comm)"
        ),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("made=600"),
        "the orphans used up the PIDs: {out}"
    );
    assert!(!out.contains("fork-failed"), "{out}");
    assert!(
        out.contains("zombies=0"),
        "orphans were left unreaped: {out}"
    );
    assert!(
        out.contains("pid1=execd"),
        "PID 1 is not sessionbox's init: {out}"
    );
    // Still usable afterwards, and the host gained no zombies.
    let (code, out) = o.sh("orphans", &format!("(sleep 0.2 &); sleep 1; {zombies}"));
    assert_eq!((code, out.trim()), (0, "zombies=0"), "{out}");
    // (Other tests' processes may be between exit and reaping at either count: a margin far
    // below the 600 an unreaping PID 1 leaves.)
    assert!(
        host_zombies() < before + 50,
        "zombies on the host: {} before, {} after",
        before,
        host_zombies()
    );
    let (code, out) = o.sh("bystander", "echo still-up");
    assert_eq!((code, out.trim()), (0, "still-up"));
    for c in ["orphans", "bystander"] {
        o.cli(&["destroy", "-c", c]);
    }
}
