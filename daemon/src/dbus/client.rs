//! Client side of `org.kazeia.Speech1`, for `kazeia say`, the speech-dispatcher module and tests.

use std::collections::HashMap;

use zbus::proxy;
use zbus::wire::Variant;

#[proxy(
    interface = "org.kazeia.Speech1",
    default_service = "org.kazeia.Speech",
    default_path = "/org/kazeia/Speech"
)]
pub trait Speech {
    fn speak(&self, text: &str, options: HashMap<&str, Variant<'_>>) -> zbus::Result<u64>;
    fn stop(&self, id: u64) -> zbus::Result<()>;
    fn stop_all(&self) -> zbus::Result<u32>;
    fn stop_everyone(&self) -> zbus::Result<u32>;
    fn pause(&self) -> zbus::Result<()>;
    fn resume(&self) -> zbus::Result<()>;
    fn list_voices(&self) -> zbus::Result<Vec<(String, String, String)>>;
    fn reload(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn load_progress(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn config_problem(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn backends(&self) -> zbus::Result<HashMap<String, String>>;
    #[zbus(property)]
    fn model(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn weights(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn started(&self, id: u64) -> zbus::Result<()>;
    #[zbus(signal)]
    fn finished(&self, id: u64, reason: String) -> zbus::Result<()>;
    #[zbus(signal)]
    fn mark(&self, id: u64, name: String) -> zbus::Result<()>;
}
