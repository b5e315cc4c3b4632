//! The protobuf wire format: varints, tags and the four wire types Kubernetes messages use.

/// Why bytes are not a message (the caller answers 400).
pub(crate) type WireError = String;

/// What Go's decoder says of a message cut short.
pub(crate) const EOF: &str = "unexpected EOF";

/// One field as read off the wire.
#[derive(Debug, PartialEq)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Reads `(field number, value)` pairs.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some((&b, rest)) = self.buf.split_first() else {
                return Err(EOF.into());
            };
            self.buf = rest;
            if i == 9 && b > 1 {
                return Err("varint longer than 64 bits".into());
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(EOF.into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field, `None` at the end.
    pub(crate) fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, WireError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number =
            u32::try_from(key >> 3).map_err(|_| format!("field number {} too large", key >> 3))?;
        if number == 0 {
            return Err("field number 0".into());
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            )),
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| format!("length {len} too large"))?;
                Value::Bytes(self.take(len)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            )),
            w => {
                return Err(format!(
                    "field {number}: wire type {w} is not used by Kubernetes messages"
                ))
            }
        };
        Ok(Some((number, value)))
    }
}

/// Every varint of a packed repeated field.
pub(crate) fn packed_varints(buf: &[u8]) -> Result<Vec<u64>, WireError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while !r.buf.is_empty() {
        out.push(r.varint()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_wire_type_and_refuses_truncation() {
        // field 1 varint 150, field 2 "hi", field 3 fixed64 1, field 4 fixed32 2
        let mut buf = vec![0x08, 0x96, 0x01, 0x12, 2, b'h', b'i', 0x19];
        buf.extend(1u64.to_le_bytes());
        buf.push(0x25);
        buf.extend(2u32.to_le_bytes());
        let mut r = Reader::new(&buf);
        assert_eq!(r.next_field().unwrap(), Some((1, Value::Varint(150))));
        assert_eq!(r.next_field().unwrap(), Some((2, Value::Bytes(b"hi"))));
        assert_eq!(r.next_field().unwrap(), Some((3, Value::Fixed64(1))));
        assert_eq!(r.next_field().unwrap(), Some((4, Value::Fixed32(2))));
        assert_eq!(r.next_field().unwrap(), None);
        assert!(Reader::new(&[0x12, 5, b'a']).next_field().is_err());
        assert!(Reader::new(&[0x08, 0xff]).next_field().is_err());
        assert!(Reader::new(&[0x0b]).next_field().is_err(), "groups");
        assert!(Reader::new(&[0x00, 0x00]).next_field().is_err(), "field 0");
        assert!(Reader::new(&[0x08; 12]).next_field().is_ok());
        let long = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert!(Reader::new(&long).next_field().is_err(), "over 64 bits");
        assert_eq!(packed_varints(&[1, 0x96, 0x01]).unwrap(), vec![1, 150]);
    }
}
