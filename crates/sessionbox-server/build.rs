//! The dashboard's files (`ui/`) are built into the crate with `include_dir!`, which Cargo
//! does not know about: rebuild when any of them changes.
fn main() {
    println!("cargo:rerun-if-changed=ui");
}
