//! Rebuilds the crate when a migration is added: `embed_migrations!` reads
//! the folder at compile time, and cargo tracks only the files it already
//! knew, so a new one would otherwise be left out of an incremental build.

fn main() {
    println!("cargo::rerun-if-changed=migrations");
}
