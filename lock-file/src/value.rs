//! A leader's value in its lock file: past the counter's 4096 bytes, stamped with the token of
//! the grant it was written under and checksummed, so that a value left by an earlier holder,
//! or torn by a crash, is never read as the current holder's.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use lock_core::LeaderValue;

/// Where the value starts: past the first 4096 bytes, which the counter reads.
const VALUE_AT: u64 = 4096;
/// `<20-digit token> <8-hex length> <8-hex checksum>\n`.
const HEADER: usize = 39;

/// The counter's checksum over the token's digits and the value: a torn write reads as none.
fn checksum(token: &str, value: &[u8]) -> u32 {
    crate::counter::checksum(&[token.as_bytes(), value].concat())
}

/// Writes `value` for the holder of `token` through its writable handle, in one write.
pub(crate) fn write(writer: &File, token: u64, value: &[u8]) -> io::Result<()> {
    let digits = format!("{token:020}");
    let mut bytes = format!(
        "{digits} {:08x} {:08x}\n",
        value.len(),
        checksum(&digits, value)
    )
    .into_bytes();
    bytes.extend_from_slice(value);
    writer.write_all_at(&bytes, VALUE_AT)
}

/// The value written for `token`, or empty: none written, written for another holder, torn.
pub(crate) fn read(file: &File, token: u64) -> io::Result<LeaderValue> {
    let mut header = [0u8; HEADER];
    match file.read_exact_at(&mut header, VALUE_AT) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(LeaderValue::default()),
        Err(e) => return Err(e),
    }
    let text = String::from_utf8_lossy(&header);
    let mut parts = text.trim_end().split(' ');
    let (Some(digits), Some(len), Some(sum)) = (parts.next(), parts.next(), parts.next()) else {
        return Ok(LeaderValue::default());
    };
    let len = usize::from_str_radix(len, 16).unwrap_or(usize::MAX);
    if digits != format!("{token:020}") || len > lock_core::MAX_VALUE_LEN {
        return Ok(LeaderValue::default());
    }
    let mut value = vec![0u8; len];
    match file.read_exact_at(&mut value, VALUE_AT + HEADER as u64) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(LeaderValue::default()),
        Err(e) => return Err(e),
    }
    let intact = u32::from_str_radix(sum, 16).ok() == Some(checksum(digits, &value));
    Ok(if intact {
        LeaderValue::read(&value)
    } else {
        LeaderValue::default()
    })
}
