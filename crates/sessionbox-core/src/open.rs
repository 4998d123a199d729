//! Which operations create a conversation: the one rule every front end (CLI, REST, MCP) follows.
//!
//! A conversation comes to be on the first operation that makes something in it: an explicit
//! open, a command (foreground or background), a write, an upload or a directory. Every other
//! operation (reads, listings, searches, edits, removals, background-command queries) finds an
//! absent conversation absent, so a typo in an id given to `read` or `ls` never starts a
//! sandbox. A front end maps its request onto an [`Operation`] and asks it for its
//! [`OpenMode`]; the manager opens in that mode.

/// How a conversation is opened for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// Make the conversation when it does not exist, or when it expired (a new, empty one).
    CreateIfAbsent,
    /// Use the conversation only if it exists and has not expired; otherwise
    /// [`crate::Error::NotFound`], and nothing is made.
    ExistingOnly,
}

impl OpenMode {
    /// True for [`OpenMode::CreateIfAbsent`].
    pub const fn creates(self) -> bool {
        matches!(self, OpenMode::CreateIfAbsent)
    }
}

/// An operation on one conversation, as any front end names it.
///
/// ```
/// use sessionbox_core::{OpenMode, Operation};
/// assert!(Operation::Exec.creates());
/// assert_eq!(Operation::Read.open_mode(), OpenMode::ExistingOnly);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// An explicit open with nothing else (REST `POST /v1/conversations/{id}`).
    Open,
    /// A foreground command (CLI `exec`, REST `exec`, MCP `bash`).
    Exec,
    /// A background command (CLI `exec --background`, REST `exec` with `background`).
    Spawn,
    /// Writing a file (CLI `write`, REST `PUT .../files`, MCP `write`).
    Write,
    /// Writing several files from one multipart body (REST upload).
    Upload,
    /// Making a directory (CLI `mkdir`, REST `mkdir`).
    Mkdir,
    /// Reading a file (CLI `read`, REST `GET .../files`, MCP `read`).
    Read,
    /// Replacing text in a file (CLI `edit`, REST `edit`, MCP `edit`).
    Edit,
    /// Listing a directory (CLI `ls`, REST `ls`, MCP `ls`).
    List,
    /// A path's metadata (CLI `stat`, REST `stat`).
    Stat,
    /// Removing a path (CLI `rm`, REST `DELETE .../files`).
    Remove,
    /// Matching paths against a glob (CLI `glob`, REST `glob`, MCP `glob`).
    Glob,
    /// Searching file contents (CLI `grep`, REST `grep`, MCP `grep`).
    Grep,
    /// Listing background commands (CLI `commands`, REST `GET .../commands`).
    Commands,
    /// One background command's status (REST `GET .../commands/{id}`).
    CommandStatus,
    /// A background command's output (CLI `logs`, REST `.../logs`; the server's watcher).
    CommandOutput,
    /// Killing a background command (CLI `kill`, REST `.../kill`).
    KillCommand,
    /// Opening a terminal in the sandbox (CLI `shell`, REST `.../pty`).
    Terminal,
    /// Reaching the sandbox's agent for a relay that makes nothing: a preview of a port, a
    /// watch of the workspace, stdin to a running background command.
    Attach,
    /// Taking a snapshot of the workspace (CLI `snapshot`, REST `POST .../snapshots`; the
    /// origin of a fork).
    Snapshot,
    /// Replacing the workspace with a snapshot (CLI `restore`, REST `.../restore`).
    Restore,
}

impl Operation {
    /// Every operation, for tests and tables.
    pub const ALL: [Operation; 21] = [
        Operation::Open,
        Operation::Exec,
        Operation::Spawn,
        Operation::Write,
        Operation::Upload,
        Operation::Mkdir,
        Operation::Read,
        Operation::Edit,
        Operation::List,
        Operation::Stat,
        Operation::Remove,
        Operation::Glob,
        Operation::Grep,
        Operation::Commands,
        Operation::CommandStatus,
        Operation::CommandOutput,
        Operation::KillCommand,
        Operation::Terminal,
        Operation::Attach,
        Operation::Snapshot,
        Operation::Restore,
    ];

    /// True when this operation makes its conversation if it does not exist (or expired): an
    /// open, a command, a write, an upload or a directory. See the module documentation.
    pub const fn creates(self) -> bool {
        match self {
            Operation::Open
            | Operation::Exec
            | Operation::Spawn
            | Operation::Write
            | Operation::Upload
            | Operation::Mkdir
            | Operation::Terminal => true,
            Operation::Attach
            | Operation::Read
            | Operation::Edit
            | Operation::List
            | Operation::Stat
            | Operation::Remove
            | Operation::Glob
            | Operation::Grep
            | Operation::Commands
            | Operation::CommandStatus
            | Operation::CommandOutput
            | Operation::KillCommand
            | Operation::Snapshot
            | Operation::Restore => false,
        }
    }

    /// True when this operation only reads the workspace: a read, a listing, a stat, a glob
    /// or a grep. A server may run these beside a running command of the same conversation
    /// instead of after it; everything else keeps its arrival order.
    pub const fn reads_only(self) -> bool {
        match self {
            Operation::Read
            | Operation::List
            | Operation::Stat
            | Operation::Glob
            | Operation::Grep => true,
            Operation::Open
            | Operation::Exec
            | Operation::Spawn
            | Operation::Write
            | Operation::Upload
            | Operation::Mkdir
            | Operation::Edit
            | Operation::Remove
            | Operation::Commands
            | Operation::CommandStatus
            | Operation::CommandOutput
            | Operation::KillCommand
            | Operation::Terminal
            | Operation::Attach
            | Operation::Snapshot
            | Operation::Restore => false,
        }
    }

    /// True when a server may open this operation's conversation beside a running foreground
    /// command instead of after it: the reads ([`Operation::reads_only`]), and what only
    /// reaches the agent to relay a stream ([`Operation::Terminal`], [`Operation::Attach`]),
    /// which holds the conversation no longer than it takes to learn where the agent is.
    pub const fn beside_commands(self) -> bool {
        self.reads_only() || matches!(self, Operation::Terminal | Operation::Attach)
    }

    /// The mode to open the conversation in for this operation.
    pub const fn open_mode(self) -> OpenMode {
        if self.creates() {
            OpenMode::CreateIfAbsent
        } else {
            OpenMode::ExistingOnly
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_are_the_workspace_reads_and_none_of_them_creates() {
        let reads: Vec<Operation> = Operation::ALL
            .into_iter()
            .filter(|o| o.reads_only())
            .collect();
        assert_eq!(
            reads,
            [
                Operation::Read,
                Operation::List,
                Operation::Stat,
                Operation::Glob,
                Operation::Grep
            ]
        );
        assert!(reads.iter().all(|o| !o.creates()));
    }

    #[test]
    fn only_operations_that_make_something_create_the_conversation() {
        let creating: Vec<Operation> = Operation::ALL.into_iter().filter(|o| o.creates()).collect();
        assert_eq!(
            creating,
            [
                Operation::Open,
                Operation::Exec,
                Operation::Spawn,
                Operation::Write,
                Operation::Upload,
                Operation::Mkdir,
                Operation::Terminal
            ]
        );
        for o in Operation::ALL {
            assert_eq!(o.open_mode().creates(), o.creates(), "{o:?}");
        }
    }
}
