//! Test support: a standalone sandbox init, so `tests/sandbox.rs` can launch real sandboxes.
//! Production re-executes the `sessionbox` binary with a hidden subcommand instead.

fn main() {
    sessionbox_local::sandbox::init_main()
}
