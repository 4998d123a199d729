//! ARCHITECTURE.md's invariants, checked against the code (rust-analyzer keeps its "tidy" checks
//! inside `cargo test` the same way). Each test names the invariant it checks; a failure says
//! which crate broke it and how.
//!
//! The dependency facts come from cargo itself: `cargo metadata --no-deps` for what each manifest
//! declares, and `cargo tree -p CRATE -e normal` for what a crate really links (cargo tree
//! resolves features for that crate alone, so a feature another crate turns on does not hide a
//! dependency).

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Every workspace member, as `cargo metadata --no-deps` reports it.
fn members() -> Vec<Value> {
    let out = cargo()
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["packages"].as_array().unwrap().clone()
}

fn member<'a>(members: &'a [Value], name: &str) -> &'a Value {
    members
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no workspace member named {name}"))
}

/// The names of a member's direct normal (not dev, not build) dependencies.
fn direct(package: &Value) -> BTreeSet<String> {
    package["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Every crate `name` links in a normal build of it alone (its default features).
fn linked(name: &str) -> BTreeSet<String> {
    let out = cargo()
        .args([
            "tree",
            "--offline",
            "-p",
            name,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn sessionbox_crates(deps: &BTreeSet<String>) -> Vec<&String> {
    deps.iter()
        .filter(|d| d.starts_with("sessionbox"))
        .collect()
}

#[test]
fn core_does_no_io_and_depends_on_no_other_sessionbox_crate() {
    let members = members();
    let deps = direct(member(&members, "sessionbox-core"));
    assert!(
        sessionbox_crates(&deps).is_empty(),
        "sessionbox-core depends on {:?}",
        sessionbox_crates(&deps)
    );
    let io = [
        "tokio", "rustix", "libc", "nix", "reqwest", "hyper", "axum", "rusqlite", "postgres",
        "openat2",
    ];
    for crate_name in io {
        assert!(
            !deps.contains(crate_name),
            "sessionbox-core depends on {crate_name}, an I/O crate: core is pure"
        );
    }
}

#[test]
fn the_archive_format_knows_only_core_and_tar() {
    let deps = direct(member(&members(), "sessionbox-archive"));
    for d in &deps {
        assert!(
            matches!(d.as_str(), "sessionbox-core" | "tar"),
            "sessionbox-archive depends on {d}: the archive format is pure over a reader"
        );
    }
}

#[test]
fn the_agent_links_neither_the_launcher_nor_an_http_client_nor_a_store() {
    let linked = linked("sessionbox-agent");
    for forbidden in [
        "sessionbox-local",
        "sessionbox-sandbox",
        "sessionbox-store",
        "sessionbox-manager",
        "reqwest",
        "rustls",
        "seccompiler",
        "rusqlite",
        "postgres",
    ] {
        assert!(
            !linked.contains(forbidden),
            "the agent (shipped static into every sandbox and container) links {forbidden}"
        );
    }
    for needed in ["sessionbox-fs", "sessionbox-execd", "sessionbox-process"] {
        assert!(
            linked.contains(needed),
            "the agent no longer links {needed}"
        );
    }
}

#[test]
fn only_the_server_serves_the_http_api_and_mcp() {
    let members = members();
    for package in &members {
        let name = package["name"].as_str().unwrap();
        let deps = direct(package);
        // The agent serves execd (OpenSandbox's protocol) with axum; the bench is an MCP
        // client measuring the server.
        if deps.contains("axum") {
            assert!(
                matches!(name, "sessionbox-server" | "sessionbox-agent"),
                "{name} depends on axum: only the server (HTTP API, MCP) and the agent (execd) serve HTTP"
            );
        }
        if deps.contains("rmcp") {
            assert!(
                matches!(name, "sessionbox-server" | "sessionbox-bench"),
                "{name} depends on rmcp: only the server speaks MCP (the bench as a client)"
            );
        }
    }
}

#[test]
fn only_the_store_knows_sql() {
    for package in &members() {
        let name = package["name"].as_str().unwrap();
        let deps = direct(package);
        for sql in ["rusqlite", "postgres"] {
            assert!(
                name == "sessionbox-store" || !deps.contains(sql),
                "{name} depends on {sql}: no SQL outside sessionbox-store"
            );
        }
    }
}

#[test]
fn runtimes_reach_recorded_state_only_through_the_directory() {
    let members = members();
    for runtime in [
        "sessionbox-local",
        "sessionbox-aio",
        "sessionbox-opensandbox",
    ] {
        let deps = direct(member(&members, runtime));
        for forbidden in [
            "sessionbox-store",
            "sessionbox-manager",
            "sessionbox-server",
        ] {
            assert!(
                !deps.contains(forbidden),
                "{runtime} depends on {forbidden}: a runtime asks core's Directory, not the store"
            );
        }
    }
    let aio = direct(member(&members, "sessionbox-aio"));
    assert!(
        !aio.contains("sessionbox-fs"),
        "sessionbox-aio depends on sessionbox-fs: its validators live in core"
    );
}

#[test]
fn the_production_binary_does_not_link_the_bench() {
    let linked = linked("sessionbox");
    for bench_only in ["sessionbox-bench", "plotters", "ab_glyph"] {
        assert!(
            !linked.contains(bench_only),
            "the sessionbox binary links {bench_only}, which only the bench needs"
        );
    }
}

/// The manifest of every member, as TOML.
fn manifests() -> Vec<(String, toml::Table)> {
    members()
        .iter()
        .map(|p| {
            let path = p["manifest_path"].as_str().unwrap();
            let text = std::fs::read_to_string(path).unwrap();
            (
                p["name"].as_str().unwrap().to_owned(),
                text.parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn every_dependency_is_declared_once_in_the_workspace() {
    let mut strays = Vec::new();
    for (name, manifest) in manifests() {
        for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = manifest.get(table).and_then(|t| t.as_table()) else {
                continue;
            };
            for (dep, spec) in deps {
                let inherited = spec
                    .as_table()
                    .and_then(|t| t.get("workspace"))
                    .and_then(|w| w.as_bool())
                    == Some(true);
                if !inherited {
                    strays.push(format!("{name} [{table}] {dep}"));
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "declare these in the root Cargo.toml's [workspace.dependencies] and write \
         `NAME.workspace = true` (features may be added per crate): {strays:#?}"
    );
}

#[test]
fn every_crate_takes_the_workspace_lints() {
    let missing: Vec<String> = manifests()
        .into_iter()
        .filter(|(_, manifest)| {
            manifest
                .get("lints")
                .and_then(|l| l.get("workspace"))
                .and_then(|w| w.as_bool())
                != Some(true)
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        missing.is_empty(),
        "add `[lints] workspace = true` to: {missing:?}"
    );
}

#[test]
fn every_crate_is_on_the_code_map() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let headings: BTreeSet<String> = map
        .lines()
        .filter_map(|l| l.strip_prefix("### `crates/"))
        .filter_map(|l| l.split('`').next())
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect();
    let crates: BTreeSet<String> = members()
        .iter()
        .map(|p| {
            Path::new(p["manifest_path"].as_str().unwrap())
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let unmapped: Vec<_> = crates.difference(&headings).collect();
    let stale: Vec<_> = headings.difference(&crates).collect();
    assert!(
        unmapped.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md's code map has no `### \\`crates/NAME\\`` entry for {unmapped:?}, \
         and entries for crates that do not exist: {stale:?}"
    );
}

/// How many lines a source file may have before it must say, in its first lines, why one
/// concept needs more (a sentence naming "800 lines").
const LONG_FILE_LINES: usize = 800;
const LONG_FILE_REASON: &str = "800 lines";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_long_without_a_reason_at_its_top() {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        let explained = text.lines().take(40).any(|l| l.contains(LONG_FILE_REASON));
        if lines > LONG_FILE_LINES && !explained {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "split these files, or say in their first 40 lines why one concept needs more than \
         {LONG_FILE_LINES} lines (a sentence with \"{LONG_FILE_REASON}\" in it): {long:#?}"
    );
}
