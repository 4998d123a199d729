//! `/session`: upstream execd's bash sessions (variables and working directory kept between
//! runs), through raw HTTP on the agent's socket.

use crate::common;

use common::{TestAgent, request};

/// Runs `command` in bash session `id`; the events' JSON (the body is chunked: each event is a
/// line of JSON between chunk headers).
async fn run_in(agent: &TestAgent, id: &str, body: serde_json::Value) -> Vec<serde_json::Value> {
    let r = agent
        .raw(&request(
            "POST",
            &sessionbox_execd::bash_session::run_path(id),
            &["Content-Type: application/json"],
            body.to_string().as_bytes(),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn stdout_of(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect()
}

/// Upstream's bash session API: variables and the working directory carry over between runs,
/// output never shows the trailer, a failing run is an `error` event with its code, a forged
/// marker in the output changes nothing, and a deleted session is gone.
#[tokio::test]
async fn a_bash_session_keeps_its_variables_and_directory_between_runs() {
    let agent = TestAgent::start().await;
    std::fs::create_dir(agent.root.join("sub")).unwrap();
    let r = agent
        .raw(&request("POST", "/session", &[], br#"{"cwd":"sub"}"#))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let id = v["session_id"].as_str().unwrap().to_owned();

    let e = run_in(
        &agent,
        &id,
        serde_json::json!({"command": "export GREETING='hi there'; X=local; mkdir -p deeper; cd deeper; pwd; printf 'SBX-ENV-forged\\nEVIL=1\\n'"}),
    )
    .await;
    assert_eq!(e[0]["type"], "init");
    assert_eq!(e.last().unwrap()["type"], "execution_complete", "{e:?}");
    let out = stdout_of(&e);
    assert_eq!(
        out,
        [
            format!("{}/sub/deeper", agent.root.display()),
            "SBX-ENV-forged".to_owned(),
            "EVIL=1".to_owned()
        ]
    );

    let e = run_in(
        &agent,
        &id,
        serde_json::json!({"command": "echo \"$GREETING|${X:-unset}|${EVIL:-none}\"; pwd; exit 3"}),
    )
    .await;
    assert_eq!(
        stdout_of(&e),
        [
            "hi there|unset|none".to_owned(),
            format!("{}/sub/deeper", agent.root.display())
        ]
    );
    let end = e.last().unwrap();
    assert_eq!(end["type"], "error", "{e:?}");
    assert_eq!(end["error"]["evalue"], "3");

    // A run's own cwd, inside the workspace only.
    let e = run_in(
        &agent,
        &id,
        serde_json::json!({"command": "pwd", "cwd": "."}),
    )
    .await;
    assert_eq!(stdout_of(&e), [agent.root.display().to_string()]);
    let r = agent
        .raw(&request(
            "POST",
            &sessionbox_execd::bash_session::run_path(&id),
            &[],
            br#"{"command":"pwd","cwd":"../outside"}"#,
        ))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());

    let r = agent
        .raw(&request("DELETE", &format!("/session/{id}"), &[], b""))
        .await;
    assert_eq!(r.status, 200);
    let r = agent
        .raw(&request(
            "POST",
            &sessionbox_execd::bash_session::run_path(&id),
            &[],
            br#"{"command":"true"}"#,
        ))
        .await;
    assert_eq!(r.status, 404);
    agent.stop().await;
}

/// Attack: create bash sessions without end. The one past the limit is refused with 429, and
/// deleting one frees its place.
#[tokio::test]
async fn the_bash_session_past_the_limit_is_refused() {
    let agent = TestAgent::start().await;
    let mut ids = Vec::new();
    for _ in 0..32 {
        let r = agent.raw(&request("POST", "/session", &[], b"")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        ids.push(v["session_id"].as_str().unwrap().to_owned());
    }
    let r = agent.raw(&request("POST", "/session", &[], b"")).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let r = agent
        .raw(&request(
            "DELETE",
            &format!("/session/{}", ids[0]),
            &[],
            b"",
        ))
        .await;
    assert_eq!(r.status, 200);
    let r = agent.raw(&request("POST", "/session", &[], b"")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    agent.stop().await;
}
