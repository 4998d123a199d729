//! The command endpoints of [`ExecdClient`]: run (collected, with a callback, or as a stream),
//! interrupt, status and logs.

use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use reqwest::header;

use super::{EventStream, ExecdClient, STREAM_GRACE};
use crate::error::ExecdError;
use crate::outcome::{CommandOutcome, OutcomeCollector};
use crate::types::{CommandLogs, CommandStatus, RunCommandRequest, ServerStreamEvent};
use crate::wire::{self, query};

impl ExecdClient {
    /// `POST /command`, collecting the whole outcome. Returns at the terminal event, not at the
    /// end of the body. When the request has a `timeout`, gives up [`STREAM_GRACE`] after it.
    pub async fn run_command(
        &self,
        request: &RunCommandRequest,
    ) -> Result<CommandOutcome, ExecdError> {
        self.run_command_with(request, |_| {}).await
    }

    /// Like [`run_command`](Self::run_command), also handing every event to `on_event` as it
    /// arrives (for live output).
    pub async fn run_command_with(
        &self,
        request: &RunCommandRequest,
        mut on_event: impl FnMut(&ServerStreamEvent) + Send,
    ) -> Result<CommandOutcome, ExecdError> {
        let mut collector = OutcomeCollector::new(request);
        let run = async {
            let mut events = self.run_command_stream(request).await?;
            while let Some(event) = events.next().await {
                let event = event?;
                collector.apply(&event);
                on_event(&event);
            }
            Ok::<(), ExecdError>(())
        };
        match request.timeout_ms {
            Some(ms) => {
                let limit = Duration::from_millis(ms).saturating_add(STREAM_GRACE);
                tokio::time::timeout(limit, run)
                    .await
                    .map_err(|_| ExecdError::Timeout {
                        operation: "run command",
                        after: limit,
                    })??
            }
            None => run.await?,
        }
        Ok(collector.finish())
    }

    /// `POST /command`, as a stream of events that ends right after the terminal event (the
    /// connection is dropped then, although upstream would keep it open about a second more).
    /// A body that ends before the terminal event yields a final
    /// [`StreamError::MissingTerminal`](crate::StreamError::MissingTerminal).
    ///
    /// Dropping the stream closes the connection; upstream then kills a foreground command.
    pub async fn run_command_stream(
        &self,
        request: &RunCommandRequest,
    ) -> Result<EventStream, ExecdError> {
        const OP: &str = "run command";
        request.validate().map_err(ExecdError::InvalidRequest)?;
        let body =
            serde_json::to_vec(request).map_err(|e| ExecdError::InvalidRequest(e.to_string()))?;
        let rb = self
            .request(Method::POST, self.url(wire::COMMAND, &[]), false)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, wire::EVENT_STREAM_CONTENT_TYPE)
            .header(header::CACHE_CONTROL, "no-cache")
            .body(body);
        let response = self.with_deadline(OP, self.send(OP, rb)).await?;
        Ok(self.event_stream(OP, response))
    }

    /// `DELETE /command?id=`: interrupts a running command.
    pub async fn interrupt_command(&self, id: &str) -> Result<(), ExecdError> {
        self.call(
            "interrupt command",
            Method::DELETE,
            wire::COMMAND,
            &[(query::ID, id)],
            |rb| rb,
        )
        .await
        .map(drop)
    }

    /// `GET /command/status/{id}`.
    pub async fn command_status(&self, id: &str) -> Result<CommandStatus, ExecdError> {
        const OP: &str = "command status";
        let path = wire::command_status_path(id);
        let r = self.call(OP, Method::GET, &path, &[], |rb| rb).await?;
        self.json(OP, r).await
    }

    /// `GET /command/{id}/logs?cursor=`: output of a background command after line `cursor`
    /// (all of it when `None`), and the cursor for the next call.
    pub async fn command_logs(
        &self,
        id: &str,
        cursor: Option<u64>,
    ) -> Result<CommandLogs, ExecdError> {
        const OP: &str = "command logs";
        let path = wire::command_logs_path(id);
        let cursor_text = cursor.map(|c| c.to_string());
        let q: Vec<(&str, &str)> = cursor_text
            .as_deref()
            .map(|c| vec![(query::CURSOR, c)])
            .unwrap_or_default();
        let r = self.call(OP, Method::GET, &path, &q, |rb| rb).await?;
        let next = r
            .headers()
            .get(wire::TAIL_CURSOR_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = self.body(OP, r).await?;
        Ok(CommandLogs {
            content: String::from_utf8_lossy(&body).into_owned(),
            cursor: next,
        })
    }
}
