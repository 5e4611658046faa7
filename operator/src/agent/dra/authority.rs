//! The kubelet's plugin watcher dials a registration socket by its bare path, and grpc-go then
//! sends the percent-encoded path (`%2Fvar%2Flib%2Fkubelet%2F...`) as each request's HTTP/2
//! `:authority`. The HTTP/2 stack under tonic (h2) refuses that authority as malformed and resets
//! the stream with PROTOCOL_ERROR, so the kubelet never registers the plugin (a known gap between
//! grpc-go on unix sockets and h2: kubernetes/kubernetes#109081).
//!
//! Each connection therefore goes through a relay that rewrites the header blocks the client
//! sends: every block is decoded (HPACK, keeping the client's dynamic table), and written again
//! with every field a literal the server's decoder keeps no state for, `:authority` as
//! `localhost`. Every other frame, and everything the server sends, passes unchanged. A client
//! that already sends a valid authority (the kubelet's DRA client dials `unix:<path>`) is served
//! the same.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may announce: a rewritten block is cut to it.
const MAX_FRAME: usize = 16_384;
/// What the rewritten requests say instead.
const AUTHORITY: &[u8] = b"localhost";

/// Why a connection's relay stopped (the connection is closed; h2 would have refused it too).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("reading or writing the connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("a header block does not decode: {0}")]
    Hpack(String),
    #[error("a CONTINUATION frame expected, got frame type {0:#x}")]
    Continuation(u8),
    #[error("a HEADERS frame shorter than its padding and priority")]
    Short,
}

/// One side of a relayed connection, served to tonic.
pub struct Relayed(DuplexStream);

impl tonic::transport::server::Connected for Relayed {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Relayed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Relayed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Relays `client` to the returned stream, the requests' header blocks rewritten.
pub fn relay<S>(client: S) -> Relayed
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_server, mut to_server) = tokio::io::split(ours);
    tokio::spawn(async move {
        if let Err(e) = requests(&mut from_client, &mut to_server).await {
            tracing::debug!(error = %e, "a kubelet plugin connection ended");
        }
        let _ = to_server.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    Relayed(theirs)
}

/// Copies the client's frames to the server, each header block rewritten; returns at the end of
/// the connection.
async fn requests<R, W>(from: &mut R, to: &mut W) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: nothing to rewrite.
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    let mut decoder = loona_hpack::Decoder::new();
    loop {
        let Some((kind, flags, stream, payload)) = frame(from).await? else {
            return Ok(());
        };
        if kind != HEADERS {
            write_frame(to, kind, flags, stream, &payload).await?;
            continue;
        }
        let (priority, mut block) = fragment(flags, &payload)?;
        let mut end = flags & END_HEADERS != 0;
        while !end {
            let Some((kind, more, _, payload)) = frame(from).await? else {
                return Ok(());
            };
            if kind != CONTINUATION {
                return Err(RelayError::Continuation(kind));
            }
            block.extend_from_slice(&payload);
            end = more & END_HEADERS != 0;
        }
        let fields = decoder.decode(&block).map_err(|e| RelayError::Hpack(e.to_string()))?;
        let rewritten = encode(&fields);
        write_headers(to, flags, stream, priority, &rewritten).await?;
    }
}

/// The next frame: type, flags, stream and payload; `None` at the end of the connection.
async fn frame<R: AsyncRead + Unpin>(from: &mut R) -> Result<Option<(u8, u8, [u8; 4], Vec<u8>)>, RelayError> {
    let mut head = [0u8; 9];
    match from.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], [head[5], head[6], head[7], head[8]], payload)))
}

async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    kind: u8,
    flags: u8,
    stream: [u8; 4],
    payload: &[u8],
) -> Result<(), RelayError> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
    to.write_all(&out).await?;
    Ok(())
}

/// A HEADERS frame's priority fields (when flagged) and its header block fragment, padding
/// dropped.
fn fragment(flags: u8, payload: &[u8]) -> Result<(Option<[u8; 5]>, Vec<u8>), RelayError> {
    let mut rest = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, tail) = rest.split_first().ok_or(RelayError::Short)?;
        pad = usize::from(n);
        rest = tail;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (p, tail) = rest.split_first_chunk::<5>().ok_or(RelayError::Short)?;
        priority = Some(*p);
        rest = tail;
    }
    let keep = rest.len().checked_sub(pad).ok_or(RelayError::Short)?;
    Ok((priority, rest[..keep].to_vec()))
}

/// The rewritten block as a HEADERS frame and as many CONTINUATION frames as it needs.
async fn write_headers<W: AsyncWrite + Unpin>(
    to: &mut W,
    flags: u8,
    stream: [u8; 4],
    priority: Option<[u8; 5]>,
    block: &[u8],
) -> Result<(), RelayError> {
    let mut first = Vec::new();
    if let Some(p) = priority {
        first.extend_from_slice(&p);
    }
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = block.split_at(block.len().min(room));
    first.extend_from_slice(head);
    let keep = flags & (END_STREAM | PRIORITY);
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    write_frame(to, HEADERS, keep | end, stream, &first).await?;
    while !rest.is_empty() {
        let (part, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let end = if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame(to, CONTINUATION, end, stream, part).await?;
    }
    Ok(())
}

/// `fields` as an HPACK block of literals without indexing, each name given in full (the
/// server's dynamic table stays empty), `:authority` as [`AUTHORITY`].
fn encode(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        let value: &[u8] = if name == b":authority" { AUTHORITY } else { value };
        // "Literal Header Field without Indexing, New Name" (RFC 7541 §6.2.2), strings raw.
        out.push(0x00);
        integer(&mut out, name.len(), 7, 0x00);
        out.extend_from_slice(name);
        integer(&mut out, value.len(), 7, 0x00);
        out.extend_from_slice(value);
    }
    out
}

/// An HPACK integer of `prefix` bits, the first byte's other bits `first` (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, value: usize, prefix: u8, first: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(block: &[u8], flags: u8) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[HEADERS, flags, 0, 0, 0, 1]);
        out.extend_from_slice(block);
        out
    }

    /// Two requests as grpc-go sends them over one connection (its encoder indexes every field
    /// it can): the first adds `:path`, `:authority` (the percent-encoded socket path) and
    /// `content-type` to the client's dynamic table, the second refers to them by index. Both
    /// reach the server with `:authority` `localhost` and every other field as sent, and a server
    /// decoder that starts empty reads them (nothing was added to its table).
    #[tokio::test]
    async fn the_authority_becomes_localhost_and_the_rest_stays() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.gputenancy.io-reg.sock".to_vec();
        let fields: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority".to_vec(), path.clone()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
        ];
        // RFC 7541: 0x83 and 0x86 are the static table's `:method POST` and `:scheme http`;
        // 0x40 | i a literal with incremental indexing of static name i (4 `:path`, 1
        // `:authority`, 31 `content-type`); the table then holds content-type (62), :authority
        // (63) and :path (64), which the second block names by index (0x80 | i).
        let literal = |name_index: u8, value: &[u8]| {
            let mut out = vec![0x40 | name_index];
            integer(&mut out, value.len(), 7, 0x00);
            out.extend_from_slice(value);
            out
        };
        let mut first = vec![0x83, 0x86];
        first.extend(literal(4, &fields[2].1));
        first.extend(literal(1, &path));
        first.extend(literal(31, &fields[4].1));
        let second = [0x83, 0x86, 0x80 | 64, 0x80 | 63, 0x80 | 62];
        assert_eq!(loona_hpack::Decoder::new().decode(&first).unwrap(), fields);

        let mut input = PREFACE.to_vec();
        // SETTINGS, empty: passed through.
        input.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        input.extend(headers_frame(&first, END_HEADERS));
        // The second block split over HEADERS and CONTINUATION, with padding.
        let (a, b) = second.split_at(second.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(headers_frame(&padded, PADDED | END_STREAM));
        input.extend_from_slice(&(b.len() as u32).to_be_bytes()[1..]);
        input.extend_from_slice(&[CONTINUATION, END_HEADERS, 0, 0, 0, 1]);
        input.extend_from_slice(b);

        let mut out = Vec::new();
        requests(&mut input.as_slice(), &mut out).await.unwrap();
        assert_eq!(&out[..24], PREFACE);
        assert_eq!(&out[24..33], &[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let mut rest = &out[33..];
        let mut server = loona_hpack::Decoder::new();
        let mut flags_seen = Vec::new();
        for _ in 0..2 {
            let (kind, flags, _, payload) = frame(&mut rest).await.unwrap().unwrap();
            assert_eq!(kind, HEADERS);
            flags_seen.push(flags);
            let got = server.decode(&payload).unwrap();
            let want: Vec<(Vec<u8>, Vec<u8>)> = fields
                .iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        if n == b":authority" {
                            AUTHORITY.to_vec()
                        } else {
                            v.clone()
                        },
                    )
                })
                .collect();
            assert_eq!(got, want);
        }
        assert_eq!(flags_seen, [END_HEADERS, END_HEADERS | END_STREAM]);
        assert!(rest.is_empty());
    }

    #[test]
    fn integers_use_their_prefix_then_continuation_bytes() {
        let mut out = Vec::new();
        integer(&mut out, 10, 5, 0);
        integer(&mut out, 1337, 5, 0);
        // RFC 7541 appendix C.1.1 and C.1.2.
        assert_eq!(out, [10, 31, 154, 10]);
    }
}
