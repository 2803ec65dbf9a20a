//! A front for the socket the kubelet's plugin watcher dials, which rewrites a `:authority`
//! HTTP/2 refuses into `localhost` before the gRPC server sees it.
//!
//! The kubelet's plugin watcher dials a registration socket by its path through grpc-go's
//! passthrough resolver (`grpc.DialContext(ctx, unixSocketPath, …)` in kubelet
//! `pluginmanager/operationexecutor/operation_generator.go`, no `WithAuthority`), so grpc-go
//! sends the path (`/var/lib/kubelet/plugins_registry/gpu.gpu-share.dev-reg.sock`) as
//! `:authority`. That is no URI authority, and the `h2` crate under tonic resets the stream
//! (`malformed authority`, PROTOCOL_ERROR): measured on kubelet 1.36, "RegisterPlugin error --
//! failed to get plugin info using RPC GetInfo … stream terminated by RST_STREAM with error
//! code: PROTOCOL_ERROR". The kubelet's device manager and DRA client do not hit it
//! (`WithAuthority("localhost")`, `unix:` targets), so only the registration socket needs this.
//!
//! Each accepted connection is spliced to the server through an in-memory pipe. Frames from the
//! client pass unchanged except header blocks, which are decoded (HPACK, with the client's
//! dynamic table) and encoded again (with the server's), an invalid `:authority` replaced;
//! frames from the server pass unchanged.

use std::io;
use std::str::FromStr;

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tracing::debug;

/// What a client sends first on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts before its SETTINGS say otherwise (RFC 9113 §4.2).
const MAX_FRAME: usize = 16_384;
/// Pipe buffer between the front and the server.
const PIPE: usize = 64 * 1024;
/// What an invalid authority becomes: grpc-go's own choice for `unix:` targets.
const LOCALHOST: &[u8] = b"localhost";

/// Splice `client` to a new in-memory stream, returned for the gRPC server to serve, with
/// header blocks fixed on the way in.
pub fn front<S>(client: S) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (server_side, ours) = tokio::io::duplex(PIPE);
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_server, mut to_server) = tokio::io::split(ours);
    tokio::spawn(async move {
        if let Err(e) = forward_fixing(&mut from_client, &mut to_server).await {
            debug!(error = %e, "registration connection closed");
        }
        let _ = to_server.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    server_side
}

/// One frame as read: its header fields and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    r.read_exact(&mut payload).await?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7FFF_FFFF;
    Ok(Some(Frame {
        kind: head[3],
        flags: head[4],
        stream,
        payload,
    }))
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A header block being collected: the HEADERS frame's flags and priority, and the fragments.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// Copy client frames to the server, re-encoding every header block.
async fn forward_fixing(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: pass it on and let the server refuse it.
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    let (mut decoder, mut encoder) = (Decoder::new(), Encoder::new());
    let mut block: Option<Block> = None;
    while let Some(frame) = read_frame(from).await? {
        match (frame.kind, &mut block) {
            (HEADERS, None) => block = Some(start_block(&frame)?),
            (CONTINUATION, Some(b)) if b.stream == frame.stream => {
                b.fragment.extend_from_slice(&frame.payload)
            }
            _ => {
                to.write_all(&frame_bytes(
                    frame.kind,
                    frame.flags,
                    frame.stream,
                    &frame.payload,
                ))
                .await?;
                continue;
            }
        }
        if frame.flags & END_HEADERS != 0 {
            let done = block.take().expect("a block is being collected");
            let fixed = reencode(&mut decoder, &mut encoder, &done.fragment)?;
            to.write_all(&block_frames(&done, &fixed)).await?;
        }
    }
    Ok(())
}

/// The header block fragment of a HEADERS frame, its padding and priority fields removed.
fn start_block(frame: &Frame) -> io::Result<Block> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed HEADERS frame");
    let mut body = &frame.payload[..];
    let mut pad = 0;
    if frame.flags & PADDED != 0 {
        pad = *body.first().ok_or_else(bad)? as usize;
        body = &body[1..];
    }
    let priority = if frame.flags & PRIORITY != 0 {
        let p: [u8; 5] = body
            .get(..5)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?;
        body = &body[5..];
        Some(p)
    } else {
        None
    };
    let end = body.len().checked_sub(pad).ok_or_else(bad)?;
    Ok(Block {
        stream: frame.stream,
        end_stream: frame.flags & END_STREAM != 0,
        priority,
        fragment: body[..end].to_vec(),
    })
}

/// Decode a block, replace an `:authority` that is no URI authority, encode it again.
fn reencode(decoder: &mut Decoder, encoder: &mut Encoder, block: &[u8]) -> io::Result<Vec<u8>> {
    let headers = decoder
        .decode(block)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {e:?}")))?;
    let fixed: Vec<(Vec<u8>, Vec<u8>)> = headers
        .into_iter()
        .map(|(name, value)| match name.as_slice() {
            b":authority" if !is_authority(&value) => (name, LOCALHOST.to_vec()),
            _ => (name, value),
        })
        .collect();
    Ok(encoder.encode(fixed.iter().map(|(n, v)| (&n[..], &v[..]))))
}

/// Whether `value` is an authority `h2` accepts (the same parser it uses).
pub fn is_authority(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|v| http::uri::Authority::from_str(v).is_ok())
}

/// A HEADERS frame and as many CONTINUATION frames as the block needs.
fn block_frames(block: &Block, encoded: &[u8]) -> Vec<u8> {
    let mut first = block.priority.map(|p| p.to_vec()).unwrap_or_default();
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = encoded.split_at(encoded.len().min(room));
    first.extend_from_slice(head);
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let mut out = frame_bytes(HEADERS, flags, block.stream, &first);
    while !rest.is_empty() {
        let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME));
        let flags = if more.is_empty() { END_HEADERS } else { 0 };
        out.extend(frame_bytes(CONTINUATION, flags, block.stream, chunk));
        rest = more;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_are_no_authorities_and_host_names_are() {
        assert!(!is_authority(
            b"/var/lib/kubelet/plugins_registry/gpu.gpu-share.dev-reg.sock"
        ));
        assert!(is_authority(b"localhost"));
        assert!(is_authority(b"[::]:50051"));
    }

    #[test]
    fn a_block_keeps_every_header_but_a_bad_authority() {
        let mut client = Encoder::new();
        let headers: [(&[u8], &[u8]); 3] = [
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", b"/run/x.sock"),
            (b"content-type", b"application/grpc"),
        ];
        let block = client.encode(headers);
        let (mut decoder, mut encoder) = (Decoder::new(), Encoder::new());
        let fixed = reencode(&mut decoder, &mut encoder, &block).unwrap();
        let seen = Decoder::new().decode(&fixed).unwrap();
        assert_eq!(seen[1], (b":authority".to_vec(), b"localhost".to_vec()));
        assert_eq!(seen[0].1, headers[0].1);
        assert_eq!(seen[2].1, headers[2].1);
    }

    #[test]
    fn a_long_block_is_split_into_continuations() {
        let block = Block {
            stream: 1,
            end_stream: true,
            priority: None,
            fragment: Vec::new(),
        };
        let frames = block_frames(&block, &vec![7u8; MAX_FRAME + 10]);
        assert_eq!(frames[3], HEADERS);
        assert_eq!(frames[4], END_STREAM, "END_HEADERS only on the last frame");
        let second = &frames[9 + MAX_FRAME..];
        assert_eq!((second[3], second[4]), (CONTINUATION, END_HEADERS));
        assert_eq!(u32::from_be_bytes([0, second[0], second[1], second[2]]), 10);
    }
}
