//! `kazeia manpages DIR` (hidden, for packagers): the manual pages, generated from the same clap definitions as
//! `--help`, so they cannot drift from it: `kazeia.1`, one `kazeia-COMMAND.1` per visible command and subcommand
//! (`kazeia-model-download.1`), and `kazeiad.1`. `tools/make-deb.sh` installs them under `/usr/share/man/man1`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};

#[derive(Args, Debug)]
pub struct ManpagesArgs {
    /// The folder to write the pages into (created if needed).
    pub out: PathBuf,
}

pub fn run(args: ManpagesArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let kazeia = crate::Cli::command();
    let version = env!("CARGO_PKG_VERSION");
    write_pages(&args.out, "kazeia", "kazeia", &kazeia, version)?;
    let kazeiad = <kazeiad::daemon_cmd::DaemonArgs as Args>::augment_args(
        clap::Command::new("kazeiad")
            .version(version)
            .about(kazeiad::daemon_cmd::ABOUT),
    );
    write_page(&args.out, "kazeiad", kazeiad)?;
    Ok(())
}

/// `command`'s page and, as its SUBCOMMANDS section names them, one page per visible subcommand, recursively
/// (`kazeia-model-download.1`).
fn write_pages(
    dir: &Path,
    name: &str,
    bin_name: &str,
    command: &clap::Command,
    version: &'static str,
) -> Result<()> {
    // The page's title and synopsis name the whole command line, as git's pages do.
    let page = command
        .clone()
        .name(name.to_owned())
        .bin_name(bin_name.to_owned())
        .version(version);
    write_page(dir, name, page)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        let sub_bin = format!("{bin_name} {}", sub.get_name());
        write_pages(dir, &sub_name, &sub_bin, sub, version)?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .source(format!("Kazeia {}", env!("CARGO_PKG_VERSION")))
        .manual("Kazeia Manual")
        .render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    println!("{}", path.display());
    Ok(())
}
