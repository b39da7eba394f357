//! `estafeta completions SHELL` and `estafeta man` through the real binary:
//! bash's completion script completes commands in a real bash, and the
//! manual pages name every command and carry the settings.

use std::path::Path;

use crate::common::estafeta;

/// Runs the binary with `args` in `cwd`: its stdout; fails unless it succeeds.
async fn run(cwd: &Path, args: &[&str]) -> String {
    let out = estafeta(cwd).args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What bash's completion offers for the words typed so far (the last one
/// being completed), with `script` loaded.
async fn complete_in_bash(script: &Path, words: &[&str]) -> Vec<String> {
    let line = format!(
        "source {script}; COMP_WORDS=({words}); COMP_CWORD={cword}; \
         COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; \
         _estafeta estafeta '{current}' '{previous}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script = script.display(),
        words = words.join(" "),
        cword = words.len() - 1,
        current = words[words.len() - 1],
        previous = words[words.len() - 2],
    );
    let out = tokio::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &line])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn bash_completes_commands_and_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("estafeta.bash");
    std::fs::write(&script, run(dir.path(), &["completions", "bash"]).await).unwrap();

    assert_eq!(
        complete_in_bash(&script, &["estafeta", "ser"]).await,
        ["serve"]
    );
    assert_eq!(
        complete_in_bash(&script, &["estafeta", "admin", "datab"]).await,
        ["database"]
    );
    let flags = complete_in_bash(&script, &["estafeta", "serve", "--li"]).await;
    assert_eq!(flags, ["--listen"]);
}

#[tokio::test]
async fn every_shell_gets_a_script_naming_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run(dir.path(), &["completions", shell]).await;
        for command in ["serve", "config", "admin", "completions", "man"] {
            assert!(script.contains(command), "{shell}: no {command}");
        }
    }
    let unknown = estafeta(dir.path())
        .args(["completions", "tcsh"])
        .output()
        .await
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("possible values"));
}

#[tokio::test]
async fn the_manual_pages_name_every_command_and_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let page = run(dir.path(), &["man"]).await;
    assert!(page.contains(".TH estafeta 1"), "{page}");
    for command in ["serve", "config", "admin", "completions", "man"] {
        assert!(
            page.contains(&format!("estafeta\\-{command}(1)")),
            "no {command}"
        );
    }
    // The settings, from `--help`'s closing text.
    assert!(page.contains("ESTAFETA_LOG_FORMAT"), "{page}");

    let pages = dir.path().join("man1");
    std::fs::create_dir(&pages).unwrap();
    run(dir.path(), &["man", "--out-dir", pages.to_str().unwrap()]).await;
    for name in [
        "estafeta.1",
        "estafeta-serve.1",
        "estafeta-admin.1",
        "estafeta-admin-database-create.1",
    ] {
        let text = std::fs::read_to_string(pages.join(name)).unwrap();
        assert!(text.starts_with(".ie"), "{name} is not roff: {text}");
    }
    let serve = std::fs::read_to_string(pages.join("estafeta-serve.1")).unwrap();
    assert!(serve.contains("\\-\\-listen"), "{serve}");
}
