//! Scratch directories for unit tests that need real files: one empty directory per test and
//! process under the system's temp directory.
//!
//! Owns: `dir`. Must not: be compiled outside tests.

use std::path::PathBuf;

/// An empty directory `rg-{tag}-{pid}` under the temp directory, made now (emptied first when
/// an earlier run left it). `tag` names the test, so tests running at once do not share one.
pub fn dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rg-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("scratch directory {}: {e}", dir.display());
    }
    dir
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_call_gives_an_empty_directory() {
        let d = super::dir("scratch-self");
        std::fs::write(d.join("f"), b"x").unwrap();
        let again = super::dir("scratch-self");
        assert_eq!(again, d);
        assert_eq!(std::fs::read_dir(&again).unwrap().count(), 0);
        std::fs::remove_dir_all(&again).unwrap();
    }
}
