//! The registration socket's system side: the peer's credentials,
//! passing the table's file descriptors (`SCM_RIGHTS`), binding the
//! socket safely, and [`register`], a process's side of it.

use super::*;

/// The credentials of the process at the other end of `stream`
/// (`SO_PEERCRED`): pid, uid, gid. The pid is 0 when that process is in a
/// PID namespace this one cannot see.
pub(super) fn peer_credentials(stream: &UnixStream) -> std::io::Result<(u32, u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes, as SO_PEERCRED
    // fills; the descriptor is the stream's own, open for the call. (A
    // raw `ucred` because its pid may be 0, which a non-zero pid type
    // cannot hold.)
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid, cred.gid))
}

/// Sends `bytes` on `stream` with the descriptors `fds` (`SCM_RIGHTS`).
pub(super) fn send_with_fds(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for the buffer"));
    }
    let sent = sendmsg(
        stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent < bytes.len() {
        // The descriptors went with the first byte; the rest follows.
        let mut stream = stream;
        stream.write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// Reads the coordinator's answer: one line of at most
/// [`wire::ANSWER_MAX`] bytes, and the descriptors that came with it.
fn receive_answer(stream: &UnixStream) -> std::io::Result<(String, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut got = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; wire::ANSWER_MAX];
    loop {
        match wire::first_line(&got, wire::ANSWER_MAX, "an answer") {
            wire::FirstLine::Line(line) => return Ok((line, fds)),
            wire::FirstLine::Invalid(why) => return Err(std::io::Error::other(why)),
            wire::FirstLine::Incomplete => {}
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let room = buf.len() - got.len();
        let n = match recvmsg(
            stream,
            &mut [std::io::IoSliceMut::new(&mut buf[..room])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the coordinator closed the connection without an answer",
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// Turns a registration away with `reason`.
pub(super) fn refuse(mut stream: &UnixStream, reason: String, report: &mut TickReport) {
    tracing::warn!(%reason, "registration refused");
    let line = wire::Answer::Refused(reason.clone()).to_line();
    let _ = stream.write_all(line.as_bytes());
    report.refused.push(reason);
}

/// Binds the registration socket, replacing a stale one nobody listens on.
pub(super) fn bind(path: &Path) -> Result<UnixListener, CoordinatorError> {
    let sock_err = |source| CoordinatorError::Socket {
        path: path.to_path_buf(),
        source,
    };
    check_socket_path(path)?;
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(CoordinatorError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(sock_err)?;
    }
    let listener = UnixListener::bind(path).map_err(sock_err)?;
    // Any local process may ask to register; who it is comes from its
    // credentials, not from anything it says.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(sock_err)?;
    listener.set_nonblocking(true).map_err(sock_err)?;
    Ok(listener)
}

/// Refuses a socket path the coordinator cannot trust: one whose
/// directory others may write without the sticky bit (they could replace
/// the socket), or that already holds something not a socket of this user
/// (someone else put it there first).
fn check_socket_path(path: &Path) -> Result<(), CoordinatorError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let unsafe_socket = |problem: String| CoordinatorError::UnsafeSocket {
        path: path.to_path_buf(),
        problem,
    };
    let me = rustix::process::geteuid().as_raw();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let d = std::fs::metadata(dir).map_err(|source| CoordinatorError::Socket {
        path: dir.to_path_buf(),
        source,
    })?;
    let writable_by_others = d.mode() & 0o022 != 0;
    let sticky = d.mode() & 0o1000 != 0;
    if (writable_by_others && !sticky) || (d.uid() != me && d.uid() != 0) {
        return Err(unsafe_socket(format!(
            "its directory {} (uid {}, mode {:o}) may be changed by others; put the socket in \
             a directory of root or uid {me} that only they may write",
            dir.display(),
            d.uid(),
            d.mode() & 0o7777
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(unsafe_socket(
            "something that is not a socket is there; remove it if it is stale".into(),
        )),
        Ok(m) if m.uid() != me => Err(unsafe_socket(format!(
            "the socket there belongs to uid {}: another user's coordinator, or one put \
             there to impersonate it",
            m.uid()
        ))),
        _ => Ok(()),
    }
}

/// Registers the calling process with the coordinator listening on
/// `socket`: the coordinator decides its tenant from its credentials,
/// claims a process slot and hands over the table (its objects, so the
/// process needs no access to them by name, as in a container with a
/// /dev/shm of its own), and the process maps it (the policy read-only)
/// and takes the slot over. Only a coordinator running as root or as this
/// process's user is trusted.
pub fn register(socket: &Path) -> Result<TenantHandle, CoordinatorError> {
    let sock_err = |source| CoordinatorError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(sock_err)?;
    let (_, uid, _) = peer_credentials(&stream).map_err(sock_err)?;
    let own = rustix::process::geteuid().as_raw();
    if uid != 0 && uid != own {
        return Err(CoordinatorError::Untrusted {
            path: socket.to_path_buf(),
            uid,
            own,
        });
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(sock_err)?;
    writeln!(stream, "{HELLO}").map_err(sock_err)?;
    let (line, fds) = receive_answer(&stream).map_err(sock_err)?;
    let line = line.trim_end();
    let r = match wire::Answer::parse(line) {
        Some(wire::Answer::Registered(r)) => r,
        Some(wire::Answer::Refused(reason)) => return Err(CoordinatorError::Refused(reason)),
        None => return Err(CoordinatorError::Protocol(line.to_string())),
    };
    let own_pid = r.own_pid;
    if own_pid != std::process::id() {
        return Err(CoordinatorError::Protocol(format!(
            "{line}: the coordinator registered pid {own_pid}, this is pid {}",
            std::process::id()
        )));
    }
    let [policy, state] = <[OwnedFd; 2]>::try_from(fds).map_err(|fds| {
        CoordinatorError::Protocol(format!(
            "{line}: the answer carried {} descriptors, not the table's 2",
            fds.len()
        ))
    })?;
    let table = QuotaTable::from_fds(&r.table, &policy, state)?;
    let recorded = ProcessId {
        pid: r.recorded_pid,
        start_time: r.recorded_start,
    };
    Ok(table.adopt_as(TenantId(r.tenant), r.slot, recorded)?)
}
