//! A gRPC unary call over a Unix socket the way grpc-go makes it when dialled by path through
//! the passthrough resolver, as the kubelet's plugin watcher dials registration sockets
//! (kubelet `pluginmanager/operationexecutor/operation_generator.go`: `grpc.DialContext(ctx,
//! unixSocketPath, …)` without `WithAuthority`): the `:authority` pseudo-header is the socket's
//! path. tonic's client cannot send that (a path is no URI authority), so this speaks HTTP/2
//! itself: preface, SETTINGS, one HEADERS + DATA request on stream 1, then frames until the
//! stream ends or is reset. It reproduces what a real kubelet 1.36 met: an h2 server resets
//! such a stream with PROTOCOL_ERROR.

use std::path::Path;

use loona_hpack::{Decoder, Encoder};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Call `method` (`/pluginregistration.Registration/GetInfo`) on `socket` with `request`, the
/// `:authority` set to `authority`; the decoded answer, or why there is none (`RST_STREAM
/// PROTOCOL_ERROR`, a gRPC status, a closed connection).
pub async fn unary<Req: Message, Resp: Message + Default>(
    socket: &Path,
    authority: &str,
    method: &str,
    request: &Req,
) -> Result<Resp, String> {
    let mut conn = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot dial {}: {e}", socket.display()))?;
    let headers: [(&[u8], &[u8]); 6] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", method.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let block = Encoder::new().encode(headers);
    let body = request.encode_to_vec();
    let mut message = vec![0];
    message.extend_from_slice(&(body.len() as u32).to_be_bytes());
    message.extend_from_slice(&body);
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_HEADERS, 1, &block));
    out.extend(frame(DATA, END_STREAM, 1, &message));
    conn.write_all(&out).await.map_err(|e| e.to_string())?;
    read_answer(&mut conn).await
}

async fn read_answer<Resp: Message + Default>(conn: &mut UnixStream) -> Result<Resp, String> {
    let mut decoder = Decoder::new();
    let (mut data, mut status) = (Vec::new(), None::<String>);
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head)
            .await
            .map_err(|e| format!("connection closed before an answer: {e}"))?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7FFF_FFFF;
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload)
            .await
            .map_err(|e| e.to_string())?;
        match kind {
            SETTINGS if flags & ACK == 0 => {
                conn.write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            RST_STREAM if stream == 1 => {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                let name = if code == 1 {
                    "PROTOCOL_ERROR"
                } else {
                    "another error"
                };
                return Err(format!(
                    "stream terminated by RST_STREAM with error code: {name} ({code})"
                ));
            }
            GOAWAY => return Err("the server sent GOAWAY".into()),
            HEADERS if stream == 1 => {
                let fields = decoder.decode(&payload).map_err(|e| format!("{e:?}"))?;
                for (name, value) in fields {
                    if name == b"grpc-status" {
                        status = Some(String::from_utf8_lossy(&value).into_owned());
                    }
                }
            }
            DATA if stream == 1 => data.extend_from_slice(&payload),
            _ => {}
        }
        if stream == 1 && flags & END_STREAM != 0 && matches!(kind, HEADERS | DATA) {
            break;
        }
    }
    match status.as_deref() {
        Some("0") if data.len() >= 5 => {
            Resp::decode(&data[5..]).map_err(|e| format!("cannot decode the answer: {e}"))
        }
        other => Err(format!("no answer: grpc-status {other:?}")),
    }
}
