//! `kazeia backends`: every compute backend Kazeia can use here, and why any plugin is unavailable.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use kazeia_engine::plugins::{discover, search_path};

#[derive(Args)]
pub struct BackendsArgs {
    /// Extra directory searched for backend plugins (repeatable; also KAZEIA_PLUGIN_PATH).
    #[arg(long)]
    plugin_path: Vec<PathBuf>,
}

pub fn run(args: BackendsArgs) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "cpu (built in): available — host CPU ({threads} hardware threads); always the fallback"
    );
    let dirs = search_path(&args.plugin_path);
    let plugins = discover(&dirs);
    for p in &plugins {
        let name = if p.name.is_empty() { "?" } else { &p.name };
        match &p.unavailable {
            None => println!(
                "{name} (plugin {}): available, score {} — {}",
                p.path.display(),
                p.score,
                if p.devices.is_empty() {
                    "no devices".to_string()
                } else {
                    p.devices.join("; ")
                }
            ),
            Some(reason) => println!(
                "{name} (plugin {}): unavailable — {reason}",
                p.path.display()
            ),
        }
    }
    if plugins.is_empty() {
        println!("no plugins found");
    }
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    println!("plugin search path: {}", shown.join(":"));
    Ok(())
}
