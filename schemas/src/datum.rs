//! A schema-driven serde `Deserializer` reading Avro binary straight from a byte slice.
//!
//! apache-avro's own path (`from_avro_datum` then `from_value`) builds an intermediate `Value`
//! tree and copies every string twice; worse for untrusted input, it turns a string cut short by
//! the end of the input into `Null` (which an optional field then reads as `None`) and reserves
//! array capacity from the claimed item count. This reader instead:
//!
//! * never allocates from a length it has not checked against the bytes actually left, and caps
//!   the total number of array and map items by the input length, so a crafted length prefix
//!   costs nothing;
//! * reports every end-of-input as truncation, and tells the caller where the datum ended so
//!   trailing bytes are caught;
//! * hands strings and bytes to the visitor borrowed from the input (one copy into the owned
//!   Rust value).
//!
//! It walks the writer schema, so it decodes data whose writer schema is the reader's own;
//! data written with an older schema goes through apache-avro's schema resolution instead.

use std::fmt;

use apache_avro::{
    Schema,
    schema::{RecordField, SchemaKind},
};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};

use crate::catalog::NameMap;

/// Why a datum failed to decode, and where.
#[derive(Debug)]
pub(crate) struct DatumError {
    /// Payload offset of the failure; `None` until known (errors raised by visitors).
    pub(crate) offset: Option<usize>,
    pub(crate) kind: DatumErrorKind,
}

#[derive(Debug)]
pub(crate) enum DatumErrorKind {
    /// The input ended, or a length or count claims more bytes than are left.
    Truncated { needed: u64, available: usize },
    /// Anything else.
    Invalid(String),
}

impl fmt::Display for DatumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DatumErrorKind::Truncated { needed, available } => {
                write!(f, "{needed} bytes needed, {available} left")
            }
            DatumErrorKind::Invalid(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for DatumError {}

impl de::Error for DatumError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self {
            offset: None,
            kind: DatumErrorKind::Invalid(msg.to_string()),
        }
    }
}

/// Decodes one `T` from the start of `datum` with `schema` as the writer schema. Returns the
/// value and the number of bytes it used. `base` is the datum's offset in the payload, for error
/// offsets.
pub(crate) fn decode<T: DeserializeOwned>(
    schema: &Schema,
    names: &NameMap,
    datum: &[u8],
    base: usize,
) -> Result<(T, usize), DatumError> {
    let mut reader = Reader::new(datum, base);
    let result = T::deserialize(Deserializer {
        reader: &mut reader,
        schema,
        names,
    });
    match result {
        Ok(value) => Ok((value, reader.pos)),
        Err(mut error) => {
            error.offset.get_or_insert(base + reader.pos);
            Err(error)
        }
    }
}

/// Walks one datum of `schema` at the start of `datum` without building anything, checking it is
/// well formed. Returns the number of bytes it used.
pub(crate) fn skip(
    schema: &Schema,
    names: &NameMap,
    datum: &[u8],
    base: usize,
) -> Result<usize, DatumError> {
    decode::<IgnoredAny>(schema, names, datum, base).map(|(_, used)| used)
}

struct Reader<'de> {
    input: &'de [u8],
    pos: usize,
    base: usize,
    /// Array and map items left to read in the whole datum; bounded by the input length so that
    /// zero-width items (e.g. `null`) cannot make a tiny input loop for long.
    item_budget: usize,
}

impl<'de> Reader<'de> {
    fn new(input: &'de [u8], base: usize) -> Self {
        Self {
            input,
            pos: 0,
            base,
            item_budget: input.len(),
        }
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn invalid(&self, reason: impl Into<String>) -> DatumError {
        DatumError {
            offset: Some(self.base + self.pos),
            kind: DatumErrorKind::Invalid(reason.into()),
        }
    }

    fn truncated(&self, needed: u64) -> DatumError {
        DatumError {
            offset: Some(self.base + self.pos),
            kind: DatumErrorKind::Truncated {
                needed,
                available: self.remaining(),
            },
        }
    }

    fn take(&mut self, len: usize) -> Result<&'de [u8], DatumError> {
        if len > self.remaining() {
            return Err(self.truncated(len as u64));
        }
        let bytes = &self.input[self.pos..self.pos + len];
        self.pos += len;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, DatumError> {
        let byte = *self.input.get(self.pos).ok_or_else(|| self.truncated(1))?;
        self.pos += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, DatumError> {
        let start = self.pos;
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.byte()?;
            if shift == 63 && byte > 1 {
                self.pos = start;
                return Err(self.invalid("variable-length integer overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
        }
    }

    fn long(&mut self) -> Result<i64, DatumError> {
        let zigzag = self.varint()?;
        // Zig-zag decoding: the low bit is the sign.
        Ok(((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64))
    }

    fn int(&mut self) -> Result<i32, DatumError> {
        let start = self.pos;
        let value = self.long()?;
        i32::try_from(value).map_err(|_| {
            self.pos = start;
            self.invalid(format!("int value {value} is out of the 32-bit range"))
        })
    }

    /// A non-negative length, checked against the bytes left.
    fn length(&mut self, what: &str) -> Result<usize, DatumError> {
        let start = self.pos;
        let len = self.long()?;
        if len < 0 {
            self.pos = start;
            return Err(self.invalid(format!("negative {what} length {len}")));
        }
        let len = len as u64;
        if len > self.remaining() as u64 {
            return Err(self.truncated(len));
        }
        Ok(len as usize)
    }

    fn bytes(&mut self) -> Result<&'de [u8], DatumError> {
        let len = self.length("bytes")?;
        self.take(len)
    }

    fn str(&mut self) -> Result<&'de str, DatumError> {
        let start = self.pos;
        let len = self.length("string")?;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|e| {
            self.pos = start;
            self.invalid(format!("string is not valid UTF-8: {e}"))
        })
    }

    fn bool(&mut self) -> Result<bool, DatumError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            other => {
                self.pos -= 1;
                Err(self.invalid(format!("boolean byte {other:#04x} is neither 0 nor 1")))
            }
        }
    }

    fn float(&mut self) -> Result<f32, DatumError> {
        let bytes = self.take(4)?;
        let mut buf = [0u8; 4];
        buf.copy_from_slice(bytes);
        Ok(f32::from_le_bytes(buf))
    }

    fn double(&mut self) -> Result<f64, DatumError> {
        let bytes = self.take(8)?;
        let mut buf = [0u8; 8];
        buf.copy_from_slice(bytes);
        Ok(f64::from_le_bytes(buf))
    }

    /// An index into a list of `count` alternatives (union branches or enum symbols).
    fn index(&mut self, count: usize, what: &str) -> Result<usize, DatumError> {
        let start = self.pos;
        let index = self.long()?;
        match usize::try_from(index) {
            Ok(index) if index < count => Ok(index),
            _ => {
                self.pos = start;
                Err(self.invalid(format!("{what} index {index} is out of range 0..{count}")))
            }
        }
    }

    /// The item count of the next array or map block; 0 ends the sequence.
    fn block_count(&mut self) -> Result<usize, DatumError> {
        let start = self.pos;
        let count = self.long()?;
        let count = if count < 0 {
            // A negative count is followed by the block's size in bytes.
            let size = self.long()?;
            if size < 0 {
                self.pos = start;
                return Err(self.invalid(format!("negative block size {size}")));
            }
            count.unsigned_abs()
        } else {
            count as u64
        };
        if count > self.item_budget as u64 {
            self.pos = start;
            return Err(self.truncated(count));
        }
        let count = count as usize;
        self.item_budget -= count;
        Ok(count)
    }
}

struct Deserializer<'r, 'de, 's> {
    reader: &'r mut Reader<'de>,
    schema: &'s Schema,
    names: &'s NameMap,
}

impl<'r, 'de, 's> Deserializer<'r, 'de, 's> {
    fn with_schema(self, schema: &'s Schema) -> Self {
        Self {
            reader: self.reader,
            schema,
            names: self.names,
        }
    }

    /// The schema with references followed.
    fn resolved(&self) -> Result<&'s Schema, DatumError> {
        crate::catalog::resolve(self.schema, self.names).map_err(|e| self.reader.invalid(e))
    }
}

impl<'de> de::Deserializer<'de> for Deserializer<'_, 'de, '_> {
    type Error = DatumError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DatumError> {
        let schema = self.resolved()?;
        match schema {
            Schema::Null => visitor.visit_unit(),
            Schema::Boolean => visitor.visit_bool(self.reader.bool()?),
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                visitor.visit_i32(self.reader.int()?)
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => visitor.visit_i64(self.reader.long()?),
            Schema::Float => visitor.visit_f32(self.reader.float()?),
            Schema::Double => visitor.visit_f64(self.reader.double()?),
            Schema::Bytes => visitor.visit_borrowed_bytes(self.reader.bytes()?),
            Schema::String => visitor.visit_borrowed_str(self.reader.str()?),
            Schema::Fixed(fixed) => visitor.visit_borrowed_bytes(self.reader.take(fixed.size)?),
            Schema::Enum(enum_schema) => {
                let index = self.reader.index(enum_schema.symbols.len(), "enum")?;
                visitor.visit_str(&enum_schema.symbols[index])
            }
            Schema::Union(union) => {
                let variants = union.variants();
                let index = self.reader.index(variants.len(), "union")?;
                self.with_schema(&variants[index]).deserialize_any(visitor)
            }
            Schema::Record(record) => visitor.visit_map(RecordAccess {
                reader: self.reader,
                fields: record.fields.iter(),
                pending: None,
                names: self.names,
            }),
            Schema::Array(array) => visitor.visit_seq(BlockAccess {
                reader: self.reader,
                items: &array.items,
                names: self.names,
                left_in_block: 0,
                done: false,
            }),
            Schema::Map(map) => visitor.visit_map(BlockAccess {
                reader: self.reader,
                items: &map.types,
                names: self.names,
                left_in_block: 0,
                done: false,
            }),
            Schema::Ref { .. }
            | Schema::Decimal(_)
            | Schema::BigDecimal
            | Schema::Uuid
            | Schema::Duration => Err(self.reader.invalid(format!(
                "schema type {:?} is not supported by this decoder",
                SchemaKind::from(schema)
            ))),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DatumError> {
        match self.resolved()? {
            Schema::Union(union) => {
                let variants = union.variants();
                let index = self.reader.index(variants.len(), "union")?;
                match &variants[index] {
                    Schema::Null => visitor.visit_none(),
                    branch => visitor.visit_some(self.with_schema(branch)),
                }
            }
            Schema::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DatumError> {
        match self.resolved()? {
            Schema::Enum(enum_schema) => {
                let index = self.reader.index(enum_schema.symbols.len(), "enum")?;
                let symbol: &str = &enum_schema.symbols[index];
                visitor.visit_enum(symbol.into_deserializer())
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DatumError> {
        visitor.visit_newtype_struct(self)
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

struct RecordAccess<'r, 'de, 's> {
    reader: &'r mut Reader<'de>,
    fields: std::slice::Iter<'s, RecordField>,
    pending: Option<&'s Schema>,
    names: &'s NameMap,
}

impl<'de> MapAccess<'de> for RecordAccess<'_, 'de, '_> {
    type Error = DatumError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DatumError> {
        let Some(field) = self.fields.next() else {
            return Ok(None);
        };
        self.pending = Some(&field.schema);
        let name: &str = &field.name;
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DatumError> {
        let schema = self.pending.take().ok_or_else(|| {
            self.reader
                .invalid("record value requested before its field name")
        })?;
        seed.deserialize(Deserializer {
            reader: self.reader,
            schema,
            names: self.names,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// Items of an Avro array (as a sequence) or map (as string-keyed map), in blocks.
struct BlockAccess<'r, 'de, 's> {
    reader: &'r mut Reader<'de>,
    items: &'s Schema,
    names: &'s NameMap,
    left_in_block: usize,
    done: bool,
}

impl BlockAccess<'_, '_, '_> {
    /// Whether another item follows, reading the next block header when needed.
    fn next_item(&mut self) -> Result<bool, DatumError> {
        if self.left_in_block == 0 {
            if self.done {
                return Ok(false);
            }
            self.left_in_block = self.reader.block_count()?;
            if self.left_in_block == 0 {
                self.done = true;
                return Ok(false);
            }
        }
        self.left_in_block -= 1;
        Ok(true)
    }
}

impl<'de> SeqAccess<'de> for BlockAccess<'_, 'de, '_> {
    type Error = DatumError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DatumError> {
        if !self.next_item()? {
            return Ok(None);
        }
        seed.deserialize(Deserializer {
            reader: self.reader,
            schema: self.items,
            names: self.names,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        // Only what the current block has proven to exist (its count was checked against the
        // input length).
        Some(self.left_in_block)
    }
}

impl<'de> MapAccess<'de> for BlockAccess<'_, 'de, '_> {
    type Error = DatumError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DatumError> {
        if !self.next_item()? {
            return Ok(None);
        }
        let key = self.reader.str()?;
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DatumError> {
        seed.deserialize(Deserializer {
            reader: self.reader,
            schema: self.items,
            names: self.names,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left_in_block)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    fn schema(json: &str) -> Schema {
        Schema::parse_str(json).expect("test schema parses")
    }

    fn decode_all<T: DeserializeOwned>(schema: &Schema, datum: &[u8]) -> Result<T, DatumError> {
        let (value, used) = decode::<T>(schema, &NameMap::new(), datum, 0)?;
        assert_eq!(used, datum.len(), "whole datum consumed");
        Ok(value)
    }

    #[test]
    fn reads_zigzag_longs_and_rejects_overflow() {
        let long = schema(r#""long""#);
        for (bytes, expected) in [
            (&[0x00][..], 0i64),
            (&[0x01], -1),
            (&[0x02], 1),
            (&[0x7f], -64),
            (&[0x80, 0x01], 64),
            (
                &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                i64::MAX,
            ),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                i64::MIN,
            ),
        ] {
            assert_eq!(
                decode_all::<i64>(&long, bytes).expect("valid long"),
                expected
            );
        }
        let overflow = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        let err = decode_all::<i64>(&long, &overflow).expect_err("overflow");
        assert!(matches!(err.kind, DatumErrorKind::Invalid(_)), "{err}");
        let err = decode_all::<i64>(&long, &[0x80]).expect_err("cut varint");
        assert!(
            matches!(err.kind, DatumErrorKind::Truncated { .. }),
            "{err}"
        );
    }

    #[test]
    fn int_out_of_range_is_invalid() {
        let int = schema(r#""int""#);
        // zig-zag of 2^31
        let err = decode_all::<i32>(&int, &[0x80, 0x80, 0x80, 0x80, 0x10]).expect_err("too big");
        assert!(matches!(err.kind, DatumErrorKind::Invalid(_)), "{err}");
    }

    #[test]
    fn maps_arrays_with_negative_block_counts_and_booleans() {
        let s = schema(
            r#"{"type":"record","name":"M","fields":[
                {"name":"m","type":{"type":"map","values":"boolean"}},
                {"name":"a","type":{"type":"array","items":"double"}},
                {"name":"f","type":{"type":"fixed","name":"F","size":2}},
                {"name":"x","type":"float"}]}"#,
        );
        #[derive(Debug, Deserialize, PartialEq)]
        struct M {
            m: BTreeMap<String, bool>,
            a: Vec<f64>,
            #[serde(with = "apache_avro::serde_avro_bytes")]
            f: Vec<u8>,
            x: f32,
        }
        let mut datum = vec![
            0x03, // block of -2 entries ...
            0x0c, // ... 6 bytes long
            0x02, b'k', 0x01, 0x02, b'j', 0x00, 0x00, // end of map
            0x02, // one double
        ];
        datum.extend_from_slice(&1.5f64.to_le_bytes());
        datum.push(0x00);
        datum.extend_from_slice(&[0xab, 0xcd]);
        datum.extend_from_slice(&(-2.25f32).to_le_bytes());
        let value: M = decode_all(&s, &datum).expect("valid datum");
        assert_eq!(
            value,
            M {
                m: BTreeMap::from([("k".to_owned(), true), ("j".to_owned(), false)]),
                a: vec![1.5],
                f: vec![0xab, 0xcd],
                x: -2.25,
            }
        );
        let bad_bool = [0x02, 0x02, b'k', 0x02, 0x00, 0x00];
        let err = decode_all::<M>(&s, &bad_bool).expect_err("boolean 2");
        assert_eq!(err.offset, Some(3));
    }

    #[test]
    fn huge_claimed_lengths_and_counts_fail_without_allocating() {
        let string = schema(r#""string""#);
        // Length 2^62: far more than is left.
        let datum = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        let err = decode_all::<String>(&string, &datum).expect_err("huge length");
        assert!(
            matches!(err.kind, DatumErrorKind::Truncated { needed, available: 0 } if needed == 1 << 62),
            "{err:?}"
        );
        let nulls = schema(r#"{"type":"array","items":"null"}"#);
        let err = decode_all::<Vec<()>>(&nulls, &[0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00])
            .expect_err("2^31-1 zero-width items");
        assert!(
            matches!(err.kind, DatumErrorKind::Truncated { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn references_to_named_types_are_followed() {
        let s = schema(
            r#"{"type":"record","name":"Pair","namespace":"n","fields":[
                {"name":"a","type":{"type":"enum","name":"E","symbols":["X","Y"]}},
                {"name":"b","type":"E"}]}"#,
        );
        let mut names = NameMap::new();
        if let Schema::Record(record) = &s {
            names.insert("n.E".to_owned(), record.fields[0].schema.clone());
        }
        #[derive(Debug, Deserialize, PartialEq)]
        enum E {
            X,
            Y,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct Pair {
            a: E,
            b: E,
        }
        let (pair, used) = decode::<Pair>(&s, &names, &[0x02, 0x00], 0).expect("valid datum");
        assert_eq!((pair, used), (Pair { a: E::Y, b: E::X }, 2));
        let err = decode::<Pair>(&s, &NameMap::new(), &[0x02, 0x00], 0).expect_err("no names");
        assert!(err.to_string().contains("n.E"), "{err}");
    }
}
