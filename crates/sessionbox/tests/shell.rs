//! `sessionbox shell`: a real `sessionbox` binary in a tmux pane (keys sent with
//! `send-keys`, the screen read with `capture-pane`) on the isolated runtime, and the refusal
//! of a runtime without terminals.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{EXE, Env, is_root};

/// A tmux server of its own (socket `name`), killed on drop.
struct Tmux {
    name: String,
}

impl Tmux {
    /// A 100x30 window running `command` (through `sh -c`).
    fn start(name: &str, command: &str) -> Tmux {
        let t = Tmux {
            name: name.to_owned(),
        };
        let st = t
            .cmd(&[
                "new-session",
                "-d",
                "-s",
                "m",
                "-x",
                "100",
                "-y",
                "30",
                command,
            ])
            .status()
            .unwrap();
        assert!(st.success());
        t
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.name, "-f", "/dev/null"]).args(args);
        c
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "m"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status().unwrap().success());
    }

    fn pane(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-J", "-S", "-200", "-t", "m"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits (up to 30 s) for the pane to show one of `texts` (a prompt: `$ `, or root's `# `).
    fn wait_for_any(&self, texts: &[&str]) {
        let end = Instant::now() + Duration::from_secs(30);
        while !texts.iter().any(|t| self.pane().contains(t)) {
            assert!(
                Instant::now() < end,
                "the pane never showed {texts:?}:\n{}",
                self.pane()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to 30 s) for the pane to show `text`; the pane.
    fn wait_for(&self, text: &str) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let pane = self.pane();
            if pane.contains(text) {
                return pane;
            }
            assert!(
                Instant::now() < end,
                "the pane never showed {text:?}:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

fn shell_line(data: &Path, id: &str) -> String {
    format!(
        "env -u SESSIONBOX_RUNTIME -u SESSIONBOX_TENANT {EXE} --data-dir {} shell -c {id}",
        data.display()
    )
}

/// In a real terminal: raw mode (keys reach the sandbox's shell one by one, its prompt and
/// echo come back), the window size and its change, Ctrl-C interrupting the sandbox's job (not
/// the CLI), Ctrl-D ending the shell, the local terminal's settings restored, and the shell's
/// exit status as the CLI's. On the isolated runtime.
#[test]
fn shell_in_tmux_has_the_window_size_ctrl_c_ctrl_d_and_restores_the_terminal() {
    if !is_root() {
        eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
        return;
    }
    let env = Env::new(60);
    // Writes the configuration.
    let out = env.cli(&["exec", "-c", "tty1", "--", "true"], &[]);
    assert!(out.status.success(), "{out:?}");
    in_tmux(&env.data, "isolated");
}

/// The same on the real OpenSandbox server (a container per conversation, its agent reached
/// over TCP; busybox's ash in the test image).
#[test]
fn shell_in_tmux_on_opensandbox() {
    for rt in crate::exact::runtimes("shell") {
        if rt.name == "opensandbox" {
            in_tmux(&rt.data, "opensandbox");
            rt.destroy("tty1");
        }
    }
}

fn in_tmux(data: &Path, name: &str) {
    let out = Command::new(EXE)
        .arg("--data-dir")
        .arg(data)
        .args(["exec", "-c", "tty1", "--", "echo made > made.txt"])
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .output()
        .unwrap();
    assert!(out.status.success(), "{name}: {out:?}");
    let before = data.join("stty-before");
    let after = data.join("stty-after");
    let line = shell_line(data, "tty1");
    let t = Tmux::start(
        &format!("sessionbox-pty-{name}-{}", std::process::id()),
        &format!(
            "stty -g > {b}; {line}; echo EXIT1=$?; stty -g > {a}; {line}; echo EXIT2=$?; sleep 600",
            b = before.display(),
            a = after.display()
        ),
    );
    t.wait_for_any(&["$ ", "# "]);
    t.keys(&["cat made.txt; tty; stty size", "Enter"]);
    let pane = t.wait_for("30 100");
    assert!(pane.contains("made"), "{name}: {pane}");
    assert!(pane.contains("/dev/pts/"), "{name}: {pane}");

    t.cmd(&["resize-window", "-t", "m", "-x", "120", "-y", "40"])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    t.keys(&["stty size", "Enter"]);
    t.wait_for("40 120");

    t.keys(&["sleep 30", "Enter"]);
    std::thread::sleep(Duration::from_millis(700));
    let started = Instant::now();
    t.keys(&["C-c"]);
    t.keys(&["echo st=$?", "Enter"]);
    t.wait_for("st=130");
    assert!(started.elapsed() < Duration::from_secs(10), "{name}");

    t.keys(&["C-d"]);
    t.wait_for("EXIT1=0");
    // `stty -g > after` runs after the echo: wait for what it writes (a loaded machine showed
    // the file made but still empty).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&after).map_or(true, |m| m.len() == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let restored = crate::support::text(&std::fs::read(&after).unwrap());
    assert_eq!(
        crate::support::text(&std::fs::read(&before).unwrap()),
        restored,
        "{name}: the terminal's settings after the shell"
    );

    // A second terminal in the same conversation; its exit status is the CLI's.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !t
        .pane()
        .split("EXIT1=0")
        .nth(1)
        .is_some_and(|rest| rest.contains("$ ") || rest.contains("# "))
    {
        assert!(
            Instant::now() < deadline,
            "{name}: no second prompt:\n{}",
            t.pane()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t.keys(&["exit 3", "Enter"]);
    t.wait_for("EXIT2=3");
}

/// The same on the host runtime (no sandbox: the CLI starts an agent of its own on the
/// workspace for the terminal's life).
#[test]
fn shell_in_tmux_on_host() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("sessionbox.toml"), "runtime = \"host\"\n").unwrap();
    in_tmux(&data, "host");
}
