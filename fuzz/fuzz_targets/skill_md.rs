//! Skill front matter (`sessionbox_skills::parse_skill_md`): a `SKILL.md` from a skills
//! directory, which whoever wrote the skill controls.
//!
//! Input: the file's text.
//! Properties of an accepted file: the name follows the Agent Skills rule, the description is
//! trimmed, not empty and within its length, `compatibility` within its length, the body is the
//! file's tail after the closing `---` line, the bootstrap command (when there is one) is
//! trimmed and not empty; and the document written back as front matter (YAML) and body reads
//! back as the same document.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use sessionbox_skills::{MAX_DESCRIPTION_CHARS, SkillDoc, check_name, parse_skill_md};

#[derive(Serialize)]
struct Front<'a> {
    name: &'a str,
    description: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    license: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compatibility: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a BTreeMap<String, String>,
    #[serde(rename = "allowed-tools", skip_serializing_if = "Option::is_none")]
    allowed_tools: Option<&'a str>,
}

fn write_back(doc: &SkillDoc) -> String {
    let yaml = serde_yaml_ng::to_string(&Front {
        name: &doc.name,
        description: &doc.description,
        license: doc.license.as_deref(),
        compatibility: doc.compatibility.as_deref(),
        metadata: &doc.metadata,
        allowed_tools: doc.allowed_tools.as_deref(),
    })
    .expect("a document serialises");
    format!("---\n{yaml}---\n{}", doc.body)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(doc) = parse_skill_md(text) else {
        return;
    };
    check_name(&doc.name).expect("an accepted name follows the rule");
    assert_eq!(doc.description, doc.description.trim());
    assert!(!doc.description.is_empty());
    assert!(doc.description.chars().count() <= MAX_DESCRIPTION_CHARS);
    assert!(
        doc.compatibility
            .as_ref()
            .is_none_or(|c| c.chars().count() <= 500)
    );
    assert!(text.ends_with(&doc.body));
    if let Some(b) = doc.bootstrap() {
        assert!(!b.is_empty() && b == b.trim());
    }
    let again = write_back(&doc);
    match parse_skill_md(&again) {
        Ok(back) => assert_eq!(back, doc, "written back as {again:?}"),
        Err(e) => panic!("{doc:?} written back as {again:?} does not parse: {e}"),
    }
});
