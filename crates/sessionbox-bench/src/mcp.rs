//! The MCP path of `sessionbox bench`: `bash` with `true` through `/mcp` (streamable HTTP, the
//! official Rust SDK rmcp as the client) on one warm conversation, against the library call on
//! the same conversation, back to back in each iteration.

use std::time::Instant;

use anyhow::{Context, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sessionbox_core::{ExecRequest, Session};
use sessionbox_manager::Conversation;

use crate::scale::percentiles;
use crate::stats::ms;

/// Target: MCP adds at most this much to the p50 of a warm exec, ms (issue 20).
pub(crate) const ADDED_P50_MS: f64 = 0.5;

/// `iterations` rounds of: `true` through the library session `lib`, then the `bash` tool with
/// `true` through the MCP server at `url` (key `key`) on the same conversation.
pub(crate) async fn round_trip(
    url: &str,
    key: &str,
    lib: &Conversation,
    iterations: usize,
) -> anyhow::Result<Value> {
    let id = lib.conversation().id.as_str().to_owned();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.auth_header = Some(key.to_owned());
    config.custom_headers.insert(
        "x-conversation-id".parse().context("header name")?,
        id.parse().context("conversation id as a header value")?,
    );
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = ().serve(transport).await.context("MCP initialize")?;
    let args = json!({"command": "true"});
    let call = || {
        CallToolRequestParams::new("bash")
            .with_arguments(args.as_object().cloned().unwrap_or_default())
    };
    let check = |r: &rmcp::model::CallToolResult| -> anyhow::Result<()> {
        let text = serde_json::to_string(&r.content).unwrap_or_default();
        if r.is_error == Some(true) || !text.contains("Exit code: 0") {
            bail!("the MCP bash tool did not run `true`: {text}");
        }
        Ok(())
    };
    for _ in 0..(iterations / 10).clamp(1, 20) {
        check(&client.call_tool(call()).await?)?;
    }
    let (mut via_lib, mut via_mcp) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        let t = Instant::now();
        let r = lib.exec(ExecRequest::new("true")).await?;
        via_lib.push(ms(t));
        if !r.success() {
            bail!("`true` failed through the library");
        }
        let t = Instant::now();
        check(&client.call_tool(call()).await?)?;
        via_mcp.push(ms(t));
    }
    let _ = client.cancel().await;
    let lib_stats = percentiles(via_lib);
    let mcp_stats = percentiles(via_mcp);
    let added = match (lib_stats["p50_ms"].as_f64(), mcp_stats["p50_ms"].as_f64()) {
        (Some(l), Some(m)) => json!(((m - l) * 1000.0).round() / 1000.0),
        _ => Value::Null,
    };
    Ok(json!({
        "what": "`true` on one warm conversation: library, then the MCP `bash` tool over streamable HTTP (rmcp client), back to back",
        "library": lib_stats,
        "mcp": mcp_stats,
        "added_p50_ms": added,
    }))
}
