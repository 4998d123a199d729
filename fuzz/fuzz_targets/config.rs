//! Configuration files (`sessionbox::config::FileConfig::parse`): `sessionbox.toml`, and
//! everything the binary derives from it before it starts a runtime.
//!
//! Input: the file's text.
//! Properties:
//! - parsing never panics, and neither does deriving the settings from an accepted file
//!   (lifecycle, retention, snapshots, sandbox limits, disk quota, pool sizes, skills);
//! - an error never shows a value of the file: it names the line and the rule, because a
//!   secret may have been put where it does not belong (a URL with a password under the wrong
//!   key). Checked with every string value of the file that is 6 characters or more, holds a
//!   digit or one of `:/@.`, and is no key; for a file that is not TOML, with every line of 12
//!   characters or more (values and lines that are part of the file's path, which the message
//!   names, excepted).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sessionbox::config::FileConfig;

/// Every string value in a TOML document (keys excluded), recursively.
fn strings(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        toml::Value::Table(t) => t.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fn keys(t: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in t {
        out.push(k.clone());
        match v {
            toml::Value::Table(t) => keys(t, out),
            toml::Value::Array(a) => a
                .iter()
                .filter_map(toml::Value::as_table)
                .for_each(|t| keys(t, out)),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/sessionbox/sessionbox.toml");
    match FileConfig::parse(text, path) {
        Ok(c) => {
            let _ = c.lifecycle();
            let _ = c.log_retention();
            let _ = c.snapshots(Path::new("/var/lib/sessionbox"));
            let _ = c.isolated.sandbox_limits();
            let _ = c.isolated.disk_quota();
            let _ = c.isolated.pool_sizes();
            let _ = c.opensandbox.pool_sizes();
            let _ = c.skills.resolve(None);
            let _ = c.skills.resolve(Some("/srv/skills:relative"));
        }
        Err(e) => {
            let shown = format!("{e:#}");
            let Ok(table) = text.parse::<toml::Table>() else {
                // Not TOML: the message names the line, and shows none of it.
                // (Bar a line that is part of the file's path, which the message names.)
                let shown_path = path.to_string_lossy();
                for line in text
                    .lines()
                    .map(str::trim)
                    .filter(|l| l.len() >= 12 && !shown_path.contains(l))
                {
                    assert!(
                        !shown.contains(line),
                        "the error shows the line {line:?}: {shown}"
                    );
                }
                return;
            };
            let mut values = Vec::new();
            strings(&toml::Value::Table(table.clone()), &mut values);
            let mut names = Vec::new();
            keys(&table, &mut names);
            for v in values {
                // Words of the format (field and variant names, types such as `NonZeroU32`)
                // hold no digit or punctuation, bar the `u32` of a type name: too short.
                let secret_like = v.chars().count() >= 6
                    && v.chars().all(|c| c.is_ascii_graphic())
                    && v.chars().any(|c| c.is_ascii_digit() || ":/@.".contains(c))
                    && !names.iter().any(|k| k.contains(&v))
                    && !path.to_string_lossy().contains(&v);
                if secret_like {
                    assert!(
                        !shown.contains(&v),
                        "the error shows the value {v:?}: {shown}"
                    );
                }
            }
        }
    }
});
