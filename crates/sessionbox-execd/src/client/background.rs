//! The background-command extension's endpoints on [`ExecdClient`] (see
//! [`crate::commands_ext`]).

use std::time::Duration;

use reqwest::Method;
use sessionbox_core::{
    BackgroundCommand, CommandOutput, MAX_OUTPUT_CHUNK, MAX_OUTPUT_WAIT, OutputRequest,
    STDIN_WRITE_WAIT, StdinWrite,
};

use super::ExecdClient;
use crate::commands_ext::{
    COMMANDS_PATH, OutputResponse, command_path, output_path, output_query, stdin_path,
};
use crate::error::ExecdError;
use crate::types::RunCommandRequest;

/// How much longer than the wait a client gives an output request to answer.
const WAIT_GRACE: Duration = Duration::from_secs(30);

impl ExecdClient {
    /// `POST /sessionbox/v1/commands`: starts `request` in the background on a sessionbox agent.
    ///
    /// # Errors
    /// The agent's typed error (through `From<ExecdError>`: `busy` past its limit of running
    /// commands, `invalid_request`, a path error), or a transport failure.
    pub async fn spawn_background(
        &self,
        request: &RunCommandRequest,
    ) -> Result<BackgroundCommand, ExecdError> {
        const OP: &str = "spawn background command";
        request.validate().map_err(ExecdError::InvalidRequest)?;
        let r = self.post_json(OP, COMMANDS_PATH, &[], request).await?;
        self.json(OP, r).await
    }

    /// `GET /sessionbox/v1/commands`: every background command the agent remembers.
    ///
    /// # Errors
    /// A transport failure or the agent's error.
    pub async fn background_commands(&self) -> Result<Vec<BackgroundCommand>, ExecdError> {
        const OP: &str = "list background commands";
        let r = self
            .call(OP, Method::GET, COMMANDS_PATH, &[], |rb| rb)
            .await?;
        self.json(OP, r).await
    }

    /// `GET /sessionbox/v1/commands/{id}`.
    ///
    /// # Errors
    /// `not_found` for an unknown id; a transport failure.
    pub async fn background_command(&self, id: &str) -> Result<BackgroundCommand, ExecdError> {
        const OP: &str = "background command status";
        let r = self
            .call(OP, Method::GET, &command_path(id), &[], |rb| rb)
            .await?;
        self.json(OP, r).await
    }

    /// `GET /sessionbox/v1/commands/{id}/output`: bytes from two offsets, waiting up to
    /// `read.wait` for something new (the request's deadline is the wait plus 30 s).
    ///
    /// # Errors
    /// `not_found` for an unknown id; `invalid_request` for bounds out of range; a transport
    /// failure.
    pub async fn background_output(
        &self,
        id: &str,
        read: OutputRequest,
    ) -> Result<CommandOutput, ExecdError> {
        const OP: &str = "background command output";
        if read.max_bytes > MAX_OUTPUT_CHUNK || read.wait > MAX_OUTPUT_WAIT {
            return Err(ExecdError::InvalidRequest(format!(
                "an output read takes at most {MAX_OUTPUT_CHUNK} bytes and waits at most {} ms",
                MAX_OUTPUT_WAIT.as_millis()
            )));
        }
        let (out, err, max, wait) = (
            read.stdout_from.to_string(),
            read.stderr_from.to_string(),
            read.max_bytes.to_string(),
            read.wait.as_millis().to_string(),
        );
        let q = [
            (output_query::STDOUT, out.as_str()),
            (output_query::STDERR, err.as_str()),
            (output_query::MAX_BYTES, max.as_str()),
            (output_query::WAIT_MS, wait.as_str()),
        ];
        let deadline = read.wait + WAIT_GRACE;
        let r = self
            .call(OP, Method::GET, &output_path(id), &q, |rb| {
                rb.timeout(deadline)
            })
            .await?;
        let o: OutputResponse = self.json(OP, r).await?;
        Ok(o.into())
    }

    /// `DELETE /sessionbox/v1/commands/{id}`: kills a running command and answers its status
    /// once it has ended; a finished command is answered at once.
    ///
    /// # Errors
    /// `not_found` for an unknown id; a transport failure.
    pub async fn kill_background(&self, id: &str) -> Result<BackgroundCommand, ExecdError> {
        const OP: &str = "kill background command";
        let r = self
            .call(OP, Method::DELETE, &command_path(id), &[], |rb| rb)
            .await?;
        self.json(OP, r).await
    }

    /// `POST /sessionbox/v1/commands/{id}/stdin`: writes `data` to a command started with its
    /// stdin kept open; answers how much the command took (the agent waits at most
    /// [`STDIN_WRITE_WAIT`](sessionbox_core::STDIN_WRITE_WAIT)).
    ///
    /// # Errors
    /// `not_found`, `conflict` (not kept open, closed, ended); [`ExecdError::TooLarge`] for
    /// more than [`MAX_STDIN_BYTES`](sessionbox_core::MAX_STDIN_BYTES), before sending; a
    /// transport failure.
    pub async fn write_stdin(&self, id: &str, data: &[u8]) -> Result<StdinWrite, ExecdError> {
        const OP: &str = "write background command stdin";
        if data.len() > sessionbox_core::MAX_STDIN_BYTES {
            return Err(ExecdError::TooLarge {
                what: "a write to stdin",
                limit: sessionbox_core::MAX_STDIN_BYTES as u64,
            });
        }
        let body = data.to_vec();
        let r = self
            .call(OP, Method::POST, &stdin_path(id), &[], |rb| {
                rb.header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(body)
                    .timeout(STDIN_WRITE_WAIT + WAIT_GRACE)
            })
            .await?;
        self.json(OP, r).await
    }

    /// `DELETE /sessionbox/v1/commands/{id}/stdin`: closes it (nothing to do when it was).
    ///
    /// # Errors
    /// `not_found`, `conflict` (not kept open); a transport failure.
    pub async fn close_stdin(&self, id: &str) -> Result<(), ExecdError> {
        const OP: &str = "close background command stdin";
        let r = self
            .call(OP, Method::DELETE, &stdin_path(id), &[], |rb| {
                rb.timeout(STDIN_WRITE_WAIT + WAIT_GRACE)
            })
            .await?;
        self.body(OP, r).await.map(|_| ())
    }
}
