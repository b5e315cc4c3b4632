//! KEP-5866 shard selectors: `shardRange(object.metadata.uid, '0x…', '0x…') || …`.
//!
//! [`ShardSelector`]'s `Display` renders **only** the server's canonical form, which the server echoes in
//! `metadata.shardInfo.selector`. [`FromStr`] accepts that form and its whitespace variants, and rejects
//! everything kube-apiserver rejects (with HTTP 500, which a retrying watcher would hot-loop on), with one
//! [`SelectorError`] variant per server rule; valid CEL we never send gets [`SelectorError::NotAccepted`].
//!
//! Pure: no I/O, no async. See `docs/selectors.md#selector-grammar`.

use std::{fmt, str::FromStr};

use crate::hash::ShardKey;
use crate::range::{HashRange, RangeSet, HASH_SPACE_END};
use crate::shard::{ShardCount, ShardError, ShardSet};

/// The CEL parser's expression size limit in code points, which the server enforces.
pub const MAX_SELECTOR_CODE_POINTS: usize = 100_000;

const FUNCTION: &str = "shardRange";
const SPACE_END_LITERAL: &str = "0x10000000000000000";

/// A validated shard selector: a key and one or more hash ranges (terms), matched as their union.
///
/// Built from ranges ([`ShardSelector::new`], terms in ascending range order) or parsed (terms in the
/// order given). It is never empty: owning nothing means sending no request at all.
///
/// ```
/// use kube_shard::{hash::ShardKey, range::RangeSet, selector::ShardSelector, shard::ShardCount};
///
/// let s = ShardCount::new(2).unwrap();
/// let sel = ShardSelector::new(ShardKey::Uid, &s.ranges_of([0]).unwrap()).unwrap();
/// assert_eq!(
///     sel.to_string(),
///     "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
/// );
/// assert_eq!(sel.to_string().parse::<ShardSelector>().unwrap(), sel);
/// assert!(ShardSelector::new(ShardKey::Uid, &RangeSet::new()).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ShardSelector {
    key: ShardKey,
    terms: Vec<HashRange>,
}

impl ShardSelector {
    /// The selector for a normalised range set; fails for an empty set, or when the canonical text
    /// would exceed the server's expression size limit (split the set over several requests then).
    pub fn new(key: ShardKey, ranges: &RangeSet) -> Result<Self, SelectorError> {
        Self::from_terms(key, ranges.ranges().to_vec())
    }

    /// The selector for a set of logical shards of `count`.
    pub fn for_shards(
        key: ShardKey,
        count: ShardCount,
        shards: &ShardSet,
    ) -> Result<Self, SelectorError> {
        let ranges = shards.ranges(count).map_err(SelectorError::Shard)?;
        Self::new(key, &ranges)
    }

    fn from_terms(key: ShardKey, terms: Vec<HashRange>) -> Result<Self, SelectorError> {
        if terms.is_empty() {
            return Err(SelectorError::NoRanges);
        }
        let len = rendered_len(key, &terms);
        if len > MAX_SELECTOR_CODE_POINTS {
            return Err(SelectorError::TooLong {
                len,
                terms: terms.len(),
            });
        }
        Ok(ShardSelector { key, terms })
    }

    /// The longest range set (in terms) whose selector fits the server's size limit under `key`, when
    /// every term has a 16-digit end bound (the worst case).
    #[must_use]
    pub const fn max_terms(key: ShardKey) -> usize {
        let term = term_len(key, false);
        (MAX_SELECTOR_CODE_POINTS + 4) / (term + 4)
    }

    /// The key (field) every term uses.
    #[must_use]
    pub fn key(&self) -> ShardKey {
        self.key
    }

    /// The terms in order (as rendered or as parsed).
    #[must_use]
    pub fn terms(&self) -> &[HashRange] {
        &self.terms
    }

    /// The normalised union of the terms.
    #[must_use]
    pub fn ranges(&self) -> RangeSet {
        self.terms.iter().copied().collect()
    }

    /// Whether an object with this key hash is selected, as the server decides it.
    #[inline]
    #[must_use]
    pub fn matches(&self, hash: u64) -> bool {
        self.terms.iter().any(|t| t.contains(hash))
    }

    /// The same selector with its terms normalised (sorted and merged).
    #[must_use]
    pub fn normalized(&self) -> ShardSelector {
        ShardSelector {
            key: self.key,
            terms: self.ranges().ranges().to_vec(),
        }
    }
}

const fn term_len(key: ShardKey, full_end: bool) -> usize {
    // shardRange( FIELD , 'START' , 'END' )
    FUNCTION.len() + 1 + key.field_path().len() + 2 + 20 + 2 + if full_end { 21 } else { 20 } + 1
}

fn rendered_len(key: ShardKey, terms: &[HashRange]) -> usize {
    let body: usize = terms
        .iter()
        .map(|t| term_len(key, t.end() == HASH_SPACE_END))
        .sum();
    body + 4 * terms.len().saturating_sub(1)
}

impl fmt::Display for ShardSelector {
    /// The server's canonical form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(
                f,
                "{FUNCTION}({}, '0x{:016x}', ",
                self.key.field_path(),
                t.start()
            )?;
            if t.end() == HASH_SPACE_END {
                write!(f, "'{SPACE_END_LITERAL}')")?;
            } else {
                write!(f, "'0x{:016x}')", t.end())?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShardSelector({self})")
    }
}

impl FromStr for ShardSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text)
    }
}

/// A form of CEL the server accepts but kube-shard does not parse (we never send it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnacceptedForm {
    /// `// comment`
    Comment,
    /// `\` escape sequences inside a string literal.
    EscapeSequence,
    /// `"double-quoted"` string literals.
    DoubleQuotes,
    /// `'''triple-quoted'''` string literals.
    TripleQuotes,
    /// `r'raw'` or `b'bytes'` string literals.
    PrefixedString,
    /// Parentheses around terms.
    Parentheses,
}

impl fmt::Display for UnacceptedForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnacceptedForm::Comment => "comments",
            UnacceptedForm::EscapeSequence => "escape sequences in string literals",
            UnacceptedForm::DoubleQuotes => "double-quoted string literals",
            UnacceptedForm::TripleQuotes => "triple-quoted string literals",
            UnacceptedForm::PrefixedString => "raw or bytes string literals",
            UnacceptedForm::Parentheses => "parentheses around terms",
        })
    }
}

/// Why a selector was refused. Variants up to [`SelectorError::EmptyRange`] are the server's own rules
/// (it answers them with HTTP 500 `invalid shard selector: ...`); the rest are ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// An empty or whitespace-only expression. (On the wire only the empty string means "no sharding";
    /// whitespace alone is invalid.)
    #[error("invalid shard selector: the expression is empty")]
    Empty,
    /// The expression exceeds the CEL size limit of 100 000 code points.
    #[error("invalid shard selector: {len} code points exceed the limit of {MAX_SELECTOR_CODE_POINTS}{}", too_long_hint(*.terms))]
    TooLong {
        /// Length in code points.
        len: usize,
        /// Number of terms, when built from ranges (0 when parsed).
        terms: usize,
    },
    /// The text is not a well-formed expression (unexpected character or token, unterminated string).
    #[error("invalid shard selector: syntax error at offset {pos}: {message}")]
    Syntax {
        /// Byte offset in the text.
        pos: usize,
        /// What was expected and found.
        message: String,
    },
    /// An operator other than `||` (`&&`, `!`, comparisons, arithmetic, `?:`, `in`, indexing).
    #[error("invalid shard selector: operator {op:?} at offset {pos} is not allowed; only || may join shardRange terms")]
    UnsupportedOperator {
        /// The operator.
        op: String,
        /// Byte offset.
        pos: usize,
    },
    /// A term that is not a call of `shardRange`.
    #[error("invalid shard selector: {found} at offset {pos} is not allowed; every term must be shardRange(field, 'start', 'end')")]
    NotShardRange {
        /// What was found.
        found: String,
        /// Byte offset.
        pos: usize,
    },
    /// A function other than `shardRange`.
    #[error("invalid shard selector: unknown function {name:?} at offset {pos}; only shardRange is supported")]
    UnknownFunction {
        /// The function name.
        name: String,
        /// Byte offset.
        pos: usize,
    },
    /// `shardRange` with other than three arguments.
    #[error("invalid shard selector: shardRange at offset {pos} takes 3 arguments (field, start, end), got {got}")]
    WrongArgumentCount {
        /// The number of arguments.
        got: usize,
        /// Byte offset.
        pos: usize,
    },
    /// A field other than `object.metadata.uid` or `object.metadata.namespace`.
    #[error("invalid shard selector: unsupported field {field:?} at offset {pos}; expected object.metadata.uid or object.metadata.namespace")]
    UnsupportedField {
        /// The field as written.
        field: String,
        /// Byte offset.
        pos: usize,
    },
    /// Terms of one expression hash different fields.
    #[error("invalid shard selector: all terms must use the same field, but {first} and {other} (offset {pos}) differ")]
    MixedFields {
        /// The field of the first term.
        first: &'static str,
        /// The differing field.
        other: &'static str,
        /// Byte offset of the differing field.
        pos: usize,
    },
    /// A bound that is not a string literal (an integer, identifier, ...).
    #[error("invalid shard selector: bound {found} at offset {pos} must be a string literal like '0x0000000000000000'")]
    BoundNotString {
        /// What was found.
        found: String,
        /// Byte offset.
        pos: usize,
    },
    /// A bound that is not `0x` followed by exactly 16 lowercase hex digits (or the 2^64 end bound).
    #[error("invalid shard selector: bound {value:?} at offset {pos} must be '0x' followed by exactly 16 lowercase hex digits")]
    InvalidBound {
        /// The bound's text.
        value: String,
        /// Byte offset.
        pos: usize,
    },
    /// `0x10000000000000000` (2^64) used as a start bound.
    #[error(
        "invalid shard selector: 0x10000000000000000 at offset {pos} is only valid as an end bound"
    )]
    SpaceEndAsStart {
        /// Byte offset.
        pos: usize,
    },
    /// `start >= end`: an empty range cannot be expressed.
    #[error("invalid shard selector: range at offset {pos} is empty: start {start:#018x} is not below end {end:#x}")]
    EmptyRange {
        /// The start bound.
        start: u128,
        /// The end bound.
        end: u128,
        /// Byte offset of the term.
        pos: usize,
    },
    /// Valid CEL that kube-shard chooses not to accept; write the canonical form instead.
    #[error("shard selector uses {form} at offset {pos}: the server may accept them, but kube-shard does not; write the canonical form shardRange(object.metadata.uid, '0x...', '0x...') || ...")]
    NotAccepted {
        /// The form.
        form: UnacceptedForm,
        /// Byte offset.
        pos: usize,
    },
    /// An empty range set: owning nothing means sending no request, never an empty selector.
    #[error("an empty range set cannot become a shard selector: owning nothing means sending no request")]
    NoRanges,
    /// Shard indices did not fit the shard count.
    #[error(transparent)]
    Shard(ShardError),
}

fn too_long_hint(terms: usize) -> String {
    if terms > 0 {
        format!(" ({terms} terms; split the ranges over several requests)")
    } else {
        String::new()
    }
}

// === lexer ===

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok<'a> {
    Ident(&'a str),
    Str(&'a str),
    Number(&'a str),
    LParen,
    RParen,
    Comma,
    Dot,
    OrOr,
    /// An operator the grammar forbids.
    Op(&'a str),
}

impl Tok<'_> {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier {s:?}"),
            Tok::Str(s) => format!("string '{s}'"),
            Tok::Number(s) => format!("number {s}"),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Comma => "','".into(),
            Tok::Dot => "'.'".into(),
            Tok::OrOr => "'||'".into(),
            Tok::Op(s) => format!("operator {s:?}"),
        }
    }
}

const OPERATORS: &[&str] = &[
    "&&", "==", "!=", "<=", ">=", "!", "<", ">", "+", "-", "*", "/", "%", "?", ":", "[", "]", "{",
    "}",
];

fn is_cel_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')
}

fn lex(text: &str) -> Result<Vec<(usize, Tok<'_>)>, SelectorError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if is_cel_space(c) {
            i += 1;
            continue;
        }
        if b[i..].starts_with(b"//") {
            return Err(SelectorError::NotAccepted {
                form: UnacceptedForm::Comment,
                pos: i,
            });
        }
        if b[i..].starts_with(b"||") {
            out.push((i, Tok::OrOr));
            i += 2;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            // r'...', b"..." etc: prefixed string literals
            if i < b.len()
                && (b[i] == b'\'' || b[i] == b'"')
                && word.len() <= 2
                && word.chars().all(|ch| matches!(ch, 'r' | 'R' | 'b' | 'B'))
            {
                return Err(SelectorError::NotAccepted {
                    form: UnacceptedForm::PrefixedString,
                    pos: start,
                });
            }
            if word == "in" {
                out.push((start, Tok::Op("in")));
            } else {
                out.push((start, Tok::Ident(word)));
            }
            continue;
        }
        if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            out.push((start, Tok::Number(&text[start..i])));
            continue;
        }
        match c {
            b'\'' => {
                if b[i..].starts_with(b"'''") {
                    return Err(SelectorError::NotAccepted {
                        form: UnacceptedForm::TripleQuotes,
                        pos: i,
                    });
                }
                i += 1;
                let body_start = i;
                loop {
                    match b.get(i) {
                        None | Some(b'\n') | Some(b'\r') => {
                            return Err(SelectorError::Syntax {
                                pos: start,
                                message: "unterminated string literal".into(),
                            })
                        }
                        Some(b'\\') => {
                            return Err(SelectorError::NotAccepted {
                                form: UnacceptedForm::EscapeSequence,
                                pos: i,
                            })
                        }
                        Some(b'\'') => break,
                        Some(_) => i += 1,
                    }
                }
                out.push((start, Tok::Str(&text[body_start..i])));
                i += 1;
            }
            b'"' => {
                return Err(SelectorError::NotAccepted {
                    form: UnacceptedForm::DoubleQuotes,
                    pos: i,
                })
            }
            b'(' => {
                out.push((i, Tok::LParen));
                i += 1;
            }
            b')' => {
                out.push((i, Tok::RParen));
                i += 1;
            }
            b',' => {
                out.push((i, Tok::Comma));
                i += 1;
            }
            b'.' => {
                out.push((i, Tok::Dot));
                i += 1;
            }
            _ => {
                if let Some(op) = OPERATORS
                    .iter()
                    .find(|op| b[i..].starts_with(op.as_bytes()))
                {
                    out.push((i, Tok::Op(op)));
                    i += op.len();
                } else {
                    let ch = text[i..].chars().next().unwrap_or('?');
                    return Err(SelectorError::Syntax {
                        pos: i,
                        message: format!("unexpected character {ch:?}"),
                    });
                }
            }
        }
    }
    Ok(out)
}

// === parser ===

struct Parser<'a> {
    toks: Vec<(usize, Tok<'a>)>,
    at: usize,
    end_pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&(usize, Tok<'a>)> {
        self.toks.get(self.at)
    }

    fn pos(&self) -> usize {
        self.peek().map_or(self.end_pos, |(p, _)| *p)
    }

    fn next(&mut self) -> Option<(usize, Tok<'a>)> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn unexpected(&self, expected: &str) -> SelectorError {
        match self.peek() {
            Some((pos, Tok::Op(op))) => SelectorError::UnsupportedOperator {
                op: (*op).to_owned(),
                pos: *pos,
            },
            Some((pos, tok)) => SelectorError::Syntax {
                pos: *pos,
                message: format!("expected {expected}, found {}", tok.describe()),
            },
            None => SelectorError::Syntax {
                pos: self.end_pos,
                message: format!("expected {expected}, found end of expression"),
            },
        }
    }

    fn expect(&mut self, want: &Tok<'_>, expected: &str) -> Result<usize, SelectorError> {
        match self.peek() {
            Some((pos, tok)) if tok == want => {
                let pos = *pos;
                self.at += 1;
                Ok(pos)
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    /// term := shardRange '(' field ',' bound ',' bound ')'
    fn term(&mut self) -> Result<(usize, ShardKey, HashRange), SelectorError> {
        let pos = self.pos();
        match self.next() {
            Some((_, Tok::Ident(FUNCTION))) => {}
            Some((_, Tok::Ident(name))) => {
                return Err(if matches!(self.peek(), Some((_, Tok::LParen))) {
                    SelectorError::UnknownFunction {
                        name: name.to_owned(),
                        pos,
                    }
                } else if matches!(self.peek(), Some((_, Tok::Dot))) && self.is_method_call() {
                    SelectorError::UnknownFunction {
                        name: self.method_name().unwrap_or(name).to_owned(),
                        pos,
                    }
                } else {
                    SelectorError::NotShardRange {
                        found: format!("identifier {name:?}"),
                        pos,
                    }
                })
            }
            Some((_, Tok::LParen)) => {
                return Err(SelectorError::NotAccepted {
                    form: UnacceptedForm::Parentheses,
                    pos,
                })
            }
            Some((_, Tok::Op(op))) => {
                return Err(SelectorError::UnsupportedOperator {
                    op: op.to_owned(),
                    pos,
                })
            }
            Some((_, tok)) => {
                return Err(SelectorError::NotShardRange {
                    found: tok.describe(),
                    pos,
                })
            }
            None => {
                return Err(SelectorError::Syntax {
                    pos,
                    message: "expected shardRange(...), found end of expression".into(),
                })
            }
        }
        self.expect(&Tok::LParen, "'(' after shardRange")?;
        let args = self.arguments(pos)?;
        let [field, start, end] =
            <[Arg<'a>; 3]>::try_from(args).map_err(|args| SelectorError::WrongArgumentCount {
                got: args.len(),
                pos,
            })?;
        let key = field_key(&field)?;
        let (start_pos, start) = bound(&start)?;
        if start == HASH_SPACE_END {
            return Err(SelectorError::SpaceEndAsStart { pos: start_pos });
        }
        let (_, end) = bound(&end)?;
        let range = HashRange::new(start, end).map_err(|_| SelectorError::EmptyRange {
            start,
            end,
            pos,
        })?;
        Ok((pos, key, range))
    }

    fn is_method_call(&self) -> bool {
        // ident . ident (  — receiver-style call such as `x.startsWith(...)`
        let mut j = self.at;
        while let (Some((_, Tok::Dot)), Some((_, Tok::Ident(_)))) =
            (self.toks.get(j), self.toks.get(j + 1))
        {
            j += 2;
        }
        j > self.at && matches!(self.toks.get(j), Some((_, Tok::LParen)))
    }

    fn method_name(&self) -> Option<&'a str> {
        let mut j = self.at;
        let mut name = None;
        while let (Some((_, Tok::Dot)), Some((_, Tok::Ident(n)))) =
            (self.toks.get(j), self.toks.get(j + 1))
        {
            name = Some(*n);
            j += 2;
        }
        name
    }

    /// Arguments after '(' up to and including ')'; each argument is a run of tokens.
    fn arguments(&mut self, call_pos: usize) -> Result<Vec<Arg<'a>>, SelectorError> {
        let mut args = Vec::new();
        let mut current = Arg::default();
        loop {
            match self.next() {
                None => {
                    return Err(SelectorError::Syntax {
                        pos: self.end_pos,
                        message: format!("shardRange at offset {call_pos} is missing its ')'"),
                    })
                }
                Some((_, Tok::RParen)) => {
                    if !current.toks.is_empty() || !args.is_empty() {
                        args.push(close_arg(current, self.end_pos)?);
                    }
                    return Ok(args);
                }
                Some((pos, Tok::Comma)) => {
                    args.push(close_arg(std::mem::take(&mut current), pos)?);
                }
                Some((pos, Tok::LParen)) => {
                    return Err(SelectorError::NotAccepted {
                        form: UnacceptedForm::Parentheses,
                        pos,
                    })
                }
                Some((pos, Tok::Op(op))) => {
                    return Err(SelectorError::UnsupportedOperator {
                        op: op.to_owned(),
                        pos,
                    })
                }
                Some((pos, Tok::OrOr)) => {
                    return Err(SelectorError::Syntax {
                        pos,
                        message: "'||' inside shardRange arguments".into(),
                    })
                }
                Some((pos, tok)) => {
                    if current.toks.is_empty() {
                        current.pos = pos;
                    }
                    current.toks.push(tok);
                }
            }
        }
    }
}

#[derive(Default)]
struct Arg<'a> {
    pos: usize,
    toks: Vec<Tok<'a>>,
}

fn close_arg(arg: Arg<'_>, pos: usize) -> Result<Arg<'_>, SelectorError> {
    if arg.toks.is_empty() {
        Err(SelectorError::Syntax {
            pos,
            message: "missing argument".into(),
        })
    } else {
        Ok(arg)
    }
}

fn field_key(arg: &Arg<'_>) -> Result<ShardKey, SelectorError> {
    // a dotted path: ident (. ident)*
    let mut path = String::new();
    let mut expect_ident = true;
    let mut well_formed = true;
    for tok in &arg.toks {
        match (expect_ident, tok) {
            (true, Tok::Ident(s)) => path.push_str(s),
            (false, Tok::Dot) => path.push('.'),
            (_, Tok::Str(s)) => path.push_str(&format!("'{s}'")),
            (_, Tok::Number(s)) | (_, Tok::Ident(s)) => {
                well_formed = false;
                path.push_str(s);
            }
            (_, other) => {
                well_formed = false;
                path.push_str(&other.describe());
            }
        }
        expect_ident = !expect_ident;
    }
    if !well_formed || expect_ident {
        return Err(SelectorError::UnsupportedField {
            field: path,
            pos: arg.pos,
        });
    }
    ShardKey::from_field_path(&path).ok_or(SelectorError::UnsupportedField {
        field: path,
        pos: arg.pos,
    })
}

fn bound(arg: &Arg<'_>) -> Result<(usize, u128), SelectorError> {
    let value = match arg.toks.as_slice() {
        [Tok::Str(s)] => *s,
        toks => {
            let found = toks.iter().map(Tok::describe).collect::<Vec<_>>().join(" ");
            return Err(SelectorError::BoundNotString {
                found,
                pos: arg.pos,
            });
        }
    };
    if value == SPACE_END_LITERAL {
        return Ok((arg.pos, HASH_SPACE_END));
    }
    let digits = value.strip_prefix("0x").unwrap_or("");
    let valid = digits.len() == 16
        && digits
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    match u64::from_str_radix(digits, 16) {
        Ok(v) if valid => Ok((arg.pos, u128::from(v))),
        _ => Err(SelectorError::InvalidBound {
            value: value.to_owned(),
            pos: arg.pos,
        }),
    }
}

fn parse(text: &str) -> Result<ShardSelector, SelectorError> {
    if text.bytes().all(is_cel_space) {
        return Err(SelectorError::Empty);
    }
    let code_points = text.chars().count();
    if code_points > MAX_SELECTOR_CODE_POINTS {
        return Err(SelectorError::TooLong {
            len: code_points,
            terms: 0,
        });
    }
    let mut p = Parser {
        toks: lex(text)?,
        at: 0,
        end_pos: text.len(),
    };
    let mut terms = Vec::new();
    let mut key: Option<(ShardKey, usize)> = None;
    loop {
        let (pos, k, range) = p.term()?;
        match key {
            None => key = Some((k, pos)),
            Some((first, _)) if first != k => {
                return Err(SelectorError::MixedFields {
                    first: first.field_path(),
                    other: k.field_path(),
                    pos,
                })
            }
            Some(_) => {}
        }
        terms.push(range);
        match p.peek() {
            None => break,
            Some((_, Tok::OrOr)) => {
                p.at += 1;
            }
            Some(_) => return Err(p.unexpected("'||' or end of expression")),
        }
    }
    let (key, _) = key.ok_or(SelectorError::Empty)?;
    Ok(ShardSelector { key, terms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HALF: &str =
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";

    fn r(a: u128, b: u128) -> HashRange {
        HashRange::new(a, b).unwrap()
    }

    #[test]
    fn canonical_rendering() {
        let four = ShardCount::new(4).unwrap();
        let sel = ShardSelector::new(ShardKey::Uid, &four.ranges_of([0, 3]).unwrap()).unwrap();
        assert_eq!(
            sel.to_string(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || \
             shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
        );
        let full = ShardSelector::new(ShardKey::Namespace, &RangeSet::full()).unwrap();
        assert_eq!(
            full.to_string(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"
        );
    }

    /// The server's own valid examples (kep-5866.md): 2 and 4 equal shards, a union of two ranges,
    /// extra whitespace, no whitespace.
    #[test]
    fn server_valid_examples() {
        let two_upper =
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')";
        let sel: ShardSelector = two_upper.parse().unwrap();
        assert_eq!(sel.terms(), &[r(1 << 63, 1 << 64)]);
        assert_eq!(sel.to_string(), two_upper);

        for i in 0u128..4 {
            let (a, b) = (i << 62, (i + 1) << 62);
            let end = if b == 1 << 64 {
                "0x10000000000000000".to_owned()
            } else {
                format!("0x{b:016x}")
            };
            let text = format!("shardRange(object.metadata.namespace, '0x{a:016x}', '{end}')");
            let sel: ShardSelector = text.parse().unwrap();
            assert_eq!(sel.key(), ShardKey::Namespace);
            assert_eq!(sel.terms(), &[r(a, b)]);
            assert_eq!(sel.to_string(), text);
        }

        let union = format!(
            "{HALF} || shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
        );
        let sel: ShardSelector = union.parse().unwrap();
        assert_eq!(sel.terms().len(), 2);
        assert!(sel.matches(0) && !sel.matches(0x9000_0000_0000_0000) && sel.matches(u64::MAX));

        let spaced = "  shardRange (\n\tobject . metadata . uid ,'0x0000000000000000'  ,\r\n '0x8000000000000000' )  ";
        assert_eq!(spaced.parse::<ShardSelector>().unwrap().to_string(), HALF);
        let tight = "shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000')||shardRange(object.metadata.uid,'0x8000000000000000','0x10000000000000000')";
        let sel: ShardSelector = tight.parse().unwrap();
        assert_eq!(sel.terms().len(), 2);
        assert!(sel.ranges().is_full());
    }

    #[test]
    fn terms_keep_the_order_given() {
        let text = format!(
            "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000') || {HALF}"
        );
        let sel: ShardSelector = text.parse().unwrap();
        assert_eq!(sel.to_string(), text, "echoed in request order");
        assert_eq!(sel.normalized().terms()[0], r(0, 1 << 63));
    }

    /// One case per server rejection rule of kep-5866.md, and per form we choose not to accept.
    #[test]
    fn rejection_rules() {
        use SelectorError as E;
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, fn(&SelectorError) -> bool)> = vec![
            ("", |e| matches!(e, E::Empty)),
            ("   \t\n", |e| matches!(e, E::Empty)),
            ("shardRange(object.metadata.uid, '0x0000000000000000'", |e| {
                matches!(e, E::Syntax { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000, '0x1000000000000000')", |e| {
                matches!(e, E::Syntax { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') | shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::Syntax { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') ||", |e| {
                matches!(e, E::Syntax { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::Syntax { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') && shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnsupportedOperator { op, .. } if op == "&&")
            }),
            ("!shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnsupportedOperator { op, .. } if op == "!")
            }),
            ("object.metadata.uid == 'x'", |e| matches!(e, E::NotShardRange { .. } | E::UnsupportedOperator { .. })),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') == true", |e| {
                matches!(e, E::UnsupportedOperator { op, .. } if op == "==")
            }),
            ("true", |e| matches!(e, E::NotShardRange { .. })),
            ("'0x0000000000000000'", |e| matches!(e, E::NotShardRange { .. })),
            ("hashRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnknownFunction { name, .. } if name == "hashRange")
            }),
            ("object.metadata.uid.startsWith('a')", |e| {
                matches!(e, E::UnknownFunction { name, .. } if name == "startsWith")
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000')", |e| {
                matches!(e, E::WrongArgumentCount { got: 2, .. })
            }),
            ("shardRange()", |e| matches!(e, E::WrongArgumentCount { got: 0, .. })),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::WrongArgumentCount { got: 4, .. })
            }),
            ("shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnsupportedField { field, .. } if field == "object.metadata.name")
            }),
            ("shardRange(metadata.uid, '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnsupportedField { .. })
            }),
            ("shardRange('object.metadata.uid', '0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::UnsupportedField { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')", |e| {
                matches!(e, E::MixedFields { .. })
            }),
            ("shardRange(object.metadata.uid, 0, '0x8000000000000000')", |e| {
                matches!(e, E::BoundNotString { .. })
            }),
            ("shardRange(object.metadata.uid, 0x0000000000000000, '0x8000000000000000')", |e| {
                matches!(e, E::BoundNotString { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { value, .. } if value == "0x0")
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000A')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0X0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0x00000000000000AB', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x20000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0x000000000000000g', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '+x000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::InvalidBound { .. })
            }),
            ("shardRange(object.metadata.uid, '0x10000000000000000', '0x10000000000000000')", |e| {
                matches!(e, E::SpaceEndAsStart { .. })
            }),
            ("shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::EmptyRange { .. })
            }),
            ("shardRange(object.metadata.uid, '0x8000000000000000', '0x0000000000000000')", |e| {
                matches!(e, E::EmptyRange { .. })
            }),
            // forms we choose not to accept
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') // mine", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::Comment, .. })
            }),
            ("shardRange(object.metadata.uid, '\\x30x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::EscapeSequence, .. })
            }),
            ("shardRange(object.metadata.uid, \"0x0000000000000000\", '0x8000000000000000')", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::DoubleQuotes, .. })
            }),
            ("shardRange(object.metadata.uid, '''0x0000000000000000''', '0x8000000000000000')", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::TripleQuotes, .. })
            }),
            ("shardRange(object.metadata.uid, r'0x0000000000000000', '0x8000000000000000')", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::PrefixedString, .. })
            }),
            ("(shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000'))", |e| {
                matches!(e, E::NotAccepted { form: UnacceptedForm::Parentheses, .. })
            }),
            ("shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') # x", |e| {
                matches!(e, E::Syntax { .. })
            }),
        ];
        for (text, check) in cases {
            let err = text.parse::<ShardSelector>().unwrap_err();
            assert!(check(&err), "{text:?} gave {err:?}");
            let msg = err.to_string();
            assert!(!msg.is_empty());
        }
    }

    #[test]
    fn server_rule_messages_carry_the_server_prefix() {
        let err = "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')"
            .parse::<ShardSelector>()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("invalid shard selector: "),
            "{err}"
        );
        assert!(err.to_string().contains("16 lowercase hex digits"), "{err}");
    }

    #[test]
    fn too_long_is_refused_both_ways() {
        let long = vec![HALF; 2000].join(" || ");
        assert!(matches!(
            long.parse::<ShardSelector>(),
            Err(SelectorError::TooLong { terms: 0, .. })
        ));
        // alternating shards of S = 4096 need 2048 terms: too long for one request
        let s = ShardCount::new(4096).unwrap();
        let alternating = s.ranges_of((0..4096).step_by(2)).unwrap();
        assert!(matches!(
            ShardSelector::new(ShardKey::Uid, &alternating),
            Err(SelectorError::TooLong { terms: 2048, .. })
        ));
        // the stated maximum fits
        let max = ShardSelector::max_terms(ShardKey::Namespace);
        let fits = s.ranges_of((0..4096).step_by(2).take(max)).unwrap();
        let sel = ShardSelector::new(ShardKey::Namespace, &fits).unwrap();
        assert!(sel.to_string().chars().count() <= MAX_SELECTOR_CODE_POINTS);
        assert_eq!(sel.to_string().parse::<ShardSelector>().unwrap(), sel);
    }

    #[test]
    fn non_ascii_input_is_an_error_not_a_panic() {
        for text in [
            "shardRange(ö",
            "é",
            "shardRange(object.metadata.uid, 'ü', '0x8000000000000000')",
        ] {
            assert!(text.parse::<ShardSelector>().is_err(), "{text}");
        }
    }

    fn arb_selector() -> impl Strategy<Value = ShardSelector> {
        let key = prop_oneof![Just(ShardKey::Uid), Just(ShardKey::Namespace)];
        let ranges = prop::collection::vec((0u128..=HASH_SPACE_END, 0u128..=HASH_SPACE_END), 1..20)
            .prop_filter_map("non-empty", |v| {
                let set: RangeSet = v
                    .into_iter()
                    .filter(|(a, b)| a != b)
                    .map(|(a, b)| r(a.min(b), a.max(b)))
                    .collect();
                (!set.is_empty()).then_some(set)
            });
        (key, ranges).prop_map(|(k, set)| ShardSelector::new(k, &set).unwrap())
    }

    proptest! {
        #[test]
        fn parse_render_round_trip(sel in arb_selector()) {
            let text = sel.to_string();
            let back: ShardSelector = text.parse().map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            prop_assert_eq!(&back, &sel);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn matches_agrees_with_ranges(sel in arb_selector(), h: u64) {
            prop_assert_eq!(sel.matches(h), sel.ranges().contains(h));
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = text.parse::<ShardSelector>();
        }

        #[test]
        fn mutated_canonical_text_never_panics(sel in arb_selector(), at: prop::sample::Index, ch: char) {
            let mut text = sel.to_string();
            let i = at.index(text.len());
            if text.is_char_boundary(i) {
                text.insert(i, ch);
            }
            if let Ok(back) = text.parse::<ShardSelector>() {
                // anything accepted renders to text that is accepted again
                prop_assert!(back.to_string().parse::<ShardSelector>().is_ok());
            }
        }
    }
}
