//! Who a caller is: its connection's unique name, and the process behind it, asked once of the bus
//! (`GetConnectionUnixProcessID`) and remembered until the name leaves the bus. Limits and fairness count
//! the process, so that more connections buy an app no more of the daemon.

use std::collections::HashMap;
use std::sync::Mutex;

use zbus::message::Header;

use super::sender;
use crate::request::Client;

/// Names remembered at most: beyond it the memory starts again (names that left without the daemon seeing
/// it cannot pile up).
const MAX_REMEMBERED: usize = 4096;

/// Unique name → owner, for the names seen on the daemon's one bus connection.
static OWNERS: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

fn remembered(name: &str) -> Option<String> {
    OWNERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(name)
        .cloned()
}

fn remember(name: &str, owner: &str) {
    let mut owners = OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    let map = owners.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_REMEMBERED {
        map.clear();
    }
    map.insert(name.to_owned(), owner.to_owned());
}

/// The name left the bus.
pub fn forget(name: &str) {
    if let Some(map) = OWNERS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        map.remove(name);
    }
}

/// The caller of a method: its connection, and the process behind it (the connection itself when the bus
/// cannot say, e.g. a bus over TCP).
pub async fn client(connection: &zbus::Connection, header: &Header<'_>) -> Client {
    let name = sender(header);
    if let Some(owner) = remembered(&name) {
        return Client {
            connection: name,
            owner,
        };
    }
    let owner = match process_of(connection, &name).await {
        Ok(pid) => format!("pid {pid}"),
        Err(e) => {
            tracing::debug!("the bus does not say which process {name} is ({e}); counted alone");
            name.clone()
        }
    };
    remember(&name, &owner);
    Client {
        connection: name,
        owner,
    }
}

async fn process_of(connection: &zbus::Connection, name: &str) -> zbus::Result<u32> {
    let bus = zbus::fdo::DBusProxy::new(connection).await?;
    let name = zbus::names::BusName::try_from(name)?;
    Ok(bus.get_connection_unix_process_id(name).await?)
}
