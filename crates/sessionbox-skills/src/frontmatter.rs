//! `SKILL.md`: YAML front matter between `---` lines, then the Markdown body; the fields and
//! rules of the Agent Skills specification (agentskills.io).

use std::collections::BTreeMap;

use serde::Deserialize;

/// Most characters of a skill's name (Agent Skills specification).
pub const MAX_NAME_CHARS: usize = 64;
/// Most characters of a description (Agent Skills specification).
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Most characters of `compatibility` (Agent Skills specification).
pub(crate) const MAX_COMPATIBILITY_CHARS: usize = 500;
/// The `metadata` key that holds a skill's bootstrap command (see the crate documentation).
pub const BOOTSTRAP_KEY: &str = "sessionbox-bootstrap";

/// The front matter as written. Fields the specification does not name are ignored, so skills
/// written for other agents (with their own extra fields) still load.
#[derive(Debug, Deserialize)]
struct Raw {
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    license: Option<String>,
    #[serde(default)]
    compatibility: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "allowed-tools")]
    allowed_tools: Option<String>,
}

/// A parsed, checked `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDoc {
    /// The skill's name.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// `license`, if given.
    pub license: Option<String>,
    /// `compatibility`, if given.
    pub compatibility: Option<String>,
    /// `allowed-tools`, if given.
    pub allowed_tools: Option<String>,
    /// `metadata`, string to string.
    pub metadata: BTreeMap<String, String>,
    /// The Markdown after the front matter.
    pub body: String,
}

impl SkillDoc {
    /// The bootstrap command (`metadata.sessionbox-bootstrap`), if any.
    pub fn bootstrap(&self) -> Option<&str> {
        self.metadata
            .get(BOOTSTRAP_KEY)
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
    }
}

/// Parses `SKILL.md` text. The error is one sentence naming the rule broken.
///
/// ```
/// let doc = sessionbox_skills::parse_skill_md(
///     "---\nname: pdf-tools\ndescription: Fill PDF forms.\n---\n# PDF\nRun scripts/fill.py.\n",
/// )
/// .unwrap();
/// assert_eq!(doc.name, "pdf-tools");
/// assert_eq!(doc.body, "# PDF\nRun scripts/fill.py.\n");
/// ```
///
/// # Errors
/// A message saying what is wrong with the front matter.
pub fn parse_skill_md(text: &str) -> Result<SkillDoc, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err("SKILL.md must start with a `---` line opening its YAML front matter".into());
    }
    let mut yaml = String::new();
    let mut consumed = first.len();
    let mut closed = false;
    for line in lines {
        consumed += line.len();
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        yaml.push_str(line);
    }
    if !closed {
        return Err("the front matter is not closed by a `---` line".into());
    }
    let body = text[consumed..].to_owned();
    let raw: Raw = serde_yaml_ng::from_str(&yaml)
        .map_err(|e| format!("the front matter is not valid YAML of the expected shape: {e}"))?;
    let name = raw
        .name
        .ok_or("the front matter has no `name`")?
        .trim()
        .to_owned();
    check_name(&name)?;
    let description = raw
        .description
        .ok_or("the front matter has no `description`")?
        .trim()
        .to_owned();
    if description.is_empty() {
        return Err("`description` is empty".into());
    }
    let n = description.chars().count();
    if n > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "`description` has {n} characters; at most {MAX_DESCRIPTION_CHARS} are allowed"
        ));
    }
    if let Some(c) = &raw.compatibility {
        let n = c.chars().count();
        if n > MAX_COMPATIBILITY_CHARS {
            return Err(format!(
                "`compatibility` has {n} characters; at most {MAX_COMPATIBILITY_CHARS} are allowed"
            ));
        }
    }
    Ok(SkillDoc {
        name,
        description,
        license: raw.license,
        compatibility: raw.compatibility,
        allowed_tools: raw.allowed_tools,
        metadata: raw.metadata.unwrap_or_default(),
        body,
    })
}

/// The Agent Skills name rule: 1-64 characters, lowercase ASCII letters, digits and hyphens,
/// not starting or ending with a hyphen, no two hyphens in a row.
///
/// # Errors
/// The rule, in words, with the name.
pub fn check_name(name: &str) -> Result<(), String> {
    let rule = "a skill name is 1-64 lowercase letters, digits and hyphens, not starting or ending with a hyphen, without `--`";
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(format!("invalid name {shown:?}: {rule}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_agent_skills_rule() {
        for ok in ["a", "pdf", "pdf-tools", "x1-2y", &"a".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "PDF",
            "pdf_tools",
            "-pdf",
            "pdf-",
            "pd--f",
            "pdf tools",
            "pdf/x",
            "..",
            "é",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn front_matter_is_parsed_and_checked() {
        let doc = parse_skill_md(
            "---\nname: a\ndescription: >\n  Does a.\nmetadata:\n  sessionbox-bootstrap: touch x\n  author: me\nversion: 3\n---\nbody\n",
        )
        .unwrap();
        assert_eq!(doc.description, "Does a.");
        assert_eq!(doc.bootstrap(), Some("touch x"));
        assert_eq!(doc.body, "body\n");

        let cases: &[(&str, &str)] = &[
            ("name: a\n", "must start"),
            ("---\nname: a\ndescription: d\n", "not closed"),
            ("---\ndescription: d\n---\n", "no `name`"),
            ("---\nname: a\n---\n", "no `description`"),
            ("---\nname: a\ndescription: ''\n---\n", "empty"),
            ("---\nname: A\ndescription: d\n---\n", "invalid name"),
            ("---\nname: [a\n---\n", "not valid YAML"),
            (
                "---\nname: a\ndescription: d\nmetadata: 3\n---\n",
                "not valid YAML",
            ),
        ];
        for (text, want) in cases {
            let e = parse_skill_md(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let long = format!("---\nname: a\ndescription: {}\n---\n", "d".repeat(1025));
        assert!(
            parse_skill_md(&long)
                .unwrap_err()
                .contains("1025 characters")
        );
    }
}
