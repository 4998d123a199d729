//! What users would pick instead, measured in the same run as sessionbox (`sessionbox bench`):
//! bubblewrap per exec, Anthropic's sandbox runtime (`srt`, which wraps bubblewrap) per exec,
//! firejail per exec and `docker run --rm` per exec, each included when it is available here.
//! A baseline that is not available is reported with the reason, never as a number.
//!
//! `srt` is looked for on `PATH`, then where `scripts/test` installs it
//! (`~/.cache/sessionbox-npm/node_modules/.bin/srt`, a pinned version from npm).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use crate::scale::percentiles;
use crate::stats::ms;

/// Runs `cmd` `n` times (after one untimed run that must succeed), timing spawn to exit.
fn time_command(mut make: impl FnMut() -> Command, n: usize) -> Result<Vec<f64>, String> {
    let run = |c: &mut Command| -> Result<(), String> {
        let out = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run(&mut make())?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = make();
        let t = Instant::now();
        run(&mut c)?;
        v.push(ms(t));
    }
    Ok(v)
}

/// Where `name` is on `PATH`, if it is.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn on_path(name: &str) -> bool {
    find_on_path(name).is_some()
}

/// Where `scripts/test` installs npm packages: outside the clone, kept between runs.
pub(crate) const NPM_CACHE: &str = ".cache/sessionbox-npm";

/// `bwrap` per exec: a new user, mount, PID, IPC, UTS and network namespace over a read-only
/// view of `/`, running `/bin/sh -c true` (what a per-call bubblewrap sandbox costs).
pub(crate) fn bubblewrap(n: usize) -> Value {
    if !on_path("bwrap") {
        return json!({"available": false, "reason": "bwrap is not installed (Debian: apt install bubblewrap)"});
    }
    let make = || {
        let mut c = Command::new("bwrap");
        c.args([
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "/bin/sh",
            "-c",
            "true",
        ]);
        c
    };
    match time_command(make, n) {
        Ok(v) => {
            json!({"available": true, "what": "bwrap --ro-bind / / --unshare-all ... /bin/sh -c true, per exec", "stats": percentiles(v)})
        }
        Err(e) => json!({"available": false, "reason": format!("bwrap failed here: {e}")}),
    }
}

/// `docker run --rm IMAGE /bin/sh -c true` per exec, when a Docker daemon answers and `image`
/// (or, without one, a local image named like sessionbox's sandbox images) is present locally.
pub(crate) fn docker_run(n: usize, image: Option<&str>) -> Value {
    if !on_path("docker") {
        return json!({"available": false, "reason": "docker is not installed"});
    }
    let info = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .output();
    let version = match info {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => return json!({"available": false, "reason": "no Docker daemon answers"}),
    };
    let image = match image {
        Some(i) => i.to_owned(),
        None => {
            let out = Command::new("docker")
                .args(["image", "ls", "--format", "{{.Repository}}:{{.Tag}}"])
                .stdin(Stdio::null())
                .output();
            let list = out
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            match list.lines().find(|l| l.starts_with("sessionbox/sandbox")) {
                Some(i) => i.to_owned(),
                None => {
                    return json!({"available": false, "reason": "no local image to run (scripts/opensandbox-up builds sessionbox/sandbox:local; or pass --docker-image)"});
                }
            }
        }
    };
    let make = || {
        let mut c = Command::new("docker");
        c.args([
            "run",
            "--rm",
            "--network",
            "none",
            &image,
            "/bin/sh",
            "-c",
            "true",
        ]);
        c
    };
    match time_command(make, n) {
        Ok(v) => {
            json!({"available": true, "what": format!("docker run --rm --network none {image} /bin/sh -c true, per exec"), "docker_version": version, "stats": percentiles(v)})
        }
        Err(e) => json!({"available": false, "reason": format!("docker run failed: {e}")}),
    }
}

/// Anthropic's sandbox runtime per exec: `srt /bin/sh -c true` with its default settings (no
/// network, writes only to its default paths), which wraps the command in bubblewrap (and a
/// network proxy of its own).
pub(crate) fn sandbox_runtime(n: usize) -> Value {
    let cached = std::env::var_os("HOME")
        .map(|h| {
            PathBuf::from(h)
                .join(NPM_CACHE)
                .join("node_modules/.bin/srt")
        })
        .filter(|p| p.is_file());
    let Some(srt) = find_on_path("srt").or(cached) else {
        return json!({"available": false, "reason": format!("srt is not installed (scripts/test: npm install --prefix ~/{NPM_CACHE} @anthropic-ai/sandbox-runtime)")});
    };
    let make = || {
        let mut c = Command::new(&srt);
        c.args(["/bin/sh", "-c", "true"]);
        c
    };
    match time_command(make, n) {
        Ok(v) => {
            json!({"available": true, "what": "srt /bin/sh -c true (@anthropic-ai/sandbox-runtime, default settings), per exec", "path": srt, "stats": percentiles(v)})
        }
        Err(e) => json!({"available": false, "reason": format!("srt failed here: {e}")}),
    }
}

/// firejail per exec: `firejail --quiet --noprofile --net=none /bin/sh -c true` (its own
/// namespaces and seccomp filter, no profile so that the number is the mechanism's).
pub(crate) fn firejail(n: usize) -> Value {
    if !on_path("firejail") {
        return json!({"available": false, "reason": "firejail is not installed (Debian: apt install firejail)"});
    }
    let make = || {
        let mut c = Command::new("firejail");
        c.args([
            "--quiet",
            "--noprofile",
            "--net=none",
            "--",
            "/bin/sh",
            "-c",
            "true",
        ]);
        c
    };
    match time_command(make, n) {
        Ok(v) => {
            json!({"available": true, "what": "firejail --quiet --noprofile --net=none /bin/sh -c true, per exec", "stats": percentiles(v)})
        }
        Err(e) => json!({"available": false, "reason": format!("firejail failed here: {e}")}),
    }
}
