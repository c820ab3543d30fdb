//! The protobuf wire format, read-only: one field at a time out of a message, as the request
//! body decoders ([`crate::protobuf`] for the stored built-in kinds kubectl creates,
//! [`crate::auth::proto`] for the review kinds) need it. Every malformed input (truncated varint or
//! payload, unknown wire type) is the same 400 error.

use crate::error::ApiError;

/// The error of every malformed protobuf body.
pub fn bad() -> ApiError {
    ApiError::bad_request("the protobuf body could not be decoded")
}

/// One field's payload.
pub enum Field<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2: strings, bytes, embedded messages, packed repeated fields.
    Bytes(&'a [u8]),
    /// Wire types 1 and 5 (fixed 64/32 bits): none of the decoded kinds uses them.
    Skip,
}

/// Iterates the fields of one protobuf message.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(bad)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad())
    }

    fn skip(&mut self, n: usize) -> Result<(), ApiError> {
        self.pos = self.pos.checked_add(n).filter(|p| *p <= self.buf.len()).ok_or_else(bad)?;
        Ok(())
    }

    /// The next field as (field number, payload), `None` at the end of the message.
    pub fn next_field(&mut self) -> Result<Option<(u64, Field<'a>)>, ApiError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let f = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.skip(8)?;
                Field::Skip
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| bad())?;
                let start = self.pos;
                self.skip(len)?;
                Field::Bytes(&self.buf[start..self.pos])
            }
            5 => {
                self.skip(4)?;
                Field::Skip
            }
            _ => return Err(bad()),
        };
        Ok(Some((key >> 3, f)))
    }
}

/// Every field of a message, in order.
pub fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ApiError> {
    let mut r = Reader::new(buf);
    let mut out = vec![];
    while let Some(f) = r.next_field()? {
        out.push(f);
    }
    Ok(out)
}

/// A string field's text (UTF-8 or a bad request).
pub fn text(b: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_varints_bytes_and_skips_fixed_fields() -> Result<(), ApiError> {
        // 1: varint 300; 2: "hi"; 3: fixed64; 4: fixed32.
        let msg = [&[0x08, 0xac, 0x02][..], &[0x12, 2, b'h', b'i'], &[0x19, 0, 0, 0, 0, 0, 0, 0, 0], &[0x25, 0, 0, 0, 0]].concat();
        let got: Vec<String> = fields(&msg)?
            .into_iter()
            .map(|(n, f)| match f {
                Field::Varint(v) => format!("{n}={v}"),
                Field::Bytes(b) => format!("{n}={}", String::from_utf8_lossy(b)),
                Field::Skip => format!("{n}=skip"),
            })
            .collect();
        assert_eq!(got, ["1=300", "2=hi", "3=skip", "4=skip"]);
        Ok(())
    }

    #[test]
    fn malformed_messages_are_bad_requests() {
        for (what, msg) in [
            ("truncated varint", &[0x08, 0x80][..]),
            ("varint over 64 bits", &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            ("payload past the end", &[0x12, 5, b'a']),
            ("fixed64 past the end", &[0x19, 0, 0]),
            ("wire type 3", &[0x0b]),
        ] {
            assert!(fields(msg).is_err(), "{what}");
        }
        assert!(text(&[0xff]).is_err());
    }
}
