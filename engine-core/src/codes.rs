//! The codes file shared by `kazeia decode` and `kazeia generate`: `{"codes": [[c0, …, c15], …]}`, one row of
//! codebook indices per frame.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CodesFile {
    codes: Vec<Vec<i64>>,
}

/// Parses a codes file. Each value must be a non-negative integer; widths and ranges are checked against the
/// model by the decoder.
pub fn parse_codes_json(text: &str) -> Result<Vec<Vec<u32>>> {
    let file: CodesFile = serde_json::from_str(text).map_err(|e| {
        Error::Input(format!(
            "codes file is not {{\"codes\": [[int, ...], ...]}}: {e}"
        ))
    })?;
    file.codes
        .into_iter()
        .enumerate()
        .map(|(f, row)| {
            row.into_iter()
                .enumerate()
                .map(|(q, c)| {
                    u32::try_from(c).map_err(|_| {
                        Error::Input(format!("frame {f}, codebook {q}: code {c} is out of range"))
                    })
                })
                .collect()
        })
        .collect()
}

/// Serialises codes in the same format.
pub fn codes_to_json(codes: &[Vec<u32>]) -> String {
    let rows: Vec<String> = codes
        .iter()
        .map(|row| {
            let items: Vec<String> = row.iter().map(u32::to_string).collect();
            format!("[{}]", items.join(", "))
        })
        .collect();
    format!("{{\"codes\": [\n  {}\n]}}\n", rows.join(",\n  "))
}
