//! The adapter as the control socket sees it ([`OpenRegistry`]): opens
//! lent to shim clients, their proofs, status, stats and trace.

use super::*;

impl OpenRegistry for Shared {
    fn open(&self, fh: u64) -> Option<OpenInfo> {
        let f = self.handles.file(fh)?;
        let (map, files) = f.data.snapshot();
        Some(OpenInfo {
            ino: f.ino,
            fh,
            flags: f.flags,
            uid: f.ctx.uid,
            gid: f.ctx.gid,
            data: f.data.clone(),
            map,
            files,
        })
    }

    fn client_remap(
        &self,
        fh: u64,
        map: DataMap,
        offset: u64,
        len: u64,
    ) -> mapfs::Result<Option<OpenInfo>> {
        let Some(f) = self.handles.file(fh) else {
            return Ok(None);
        };
        let files = f.data.files();
        f.data.install(map, files)?;
        f.data
            .remap_for_write(offset, len, &mut self.remap_for(&f))?;
        Ok(self.open(fh))
    }

    fn ready_to_write(&self, fh: u64) -> mapfs::Result<Option<OpenInfo>> {
        let Some(f) = self.handles.file(fh) else {
            return Ok(None);
        };
        f.data.make_writable(&mut self.remap_for(&f))?;
        Ok(self.open(fh))
    }

    fn proofs(&self) -> &Proofs {
        &self.proofs
    }

    fn writeback_cache(&self) -> bool {
        self.writeback.load(Ordering::Relaxed)
    }

    fn status(&self) -> mapfs::control::MountStatus {
        let (fs, backing) = self.identity.get().cloned().unwrap_or_default();
        mapfs::control::MountStatus {
            pid: 0,
            fs,
            backing,
            data: match self.opts.data {
                DataMode::Auto => "auto",
                DataMode::Daemon => "daemon",
                DataMode::Passthrough => "passthrough",
            }
            .to_string(),
            passthrough_active: self.passthrough_ok.load(Ordering::Relaxed),
            writeback_cache: self.writeback.load(Ordering::Relaxed),
            started_unix: self
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            clients: 0,
            connections: 0,
            open_files: self.handles.open_files() as u64,
        }
    }

    fn invalidate(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            // Errors only mean the kernel has nothing cached for it.
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
            self.stats.add(Event::Invalidation, 1);
        }
        self.tokens.bump(ino);
    }

    fn stats(&self, reset: bool) -> mapfs::stats::MountStats {
        let mut stats = self.stats.snapshot(reset);
        stats.token_bumps = self.tokens.bumps(reset);
        stats
    }

    fn trace(
        &self,
        conn: u64,
        op: Option<&str>,
        pid: Option<u32>,
    ) -> Option<(Vec<mapfs::stats::TraceEvent>, u64)> {
        let tracer = &self.stats.tracer;
        if !tracer.subscribe(conn, op, pid) {
            return None;
        }
        // Enough for one packet even with long paths: events are taken a
        // few at a time until about half a packet is filled.
        let budget = mapfs::control::MAX_PACKET / 2;
        let (mut events, mut dropped, mut size) = (Vec::new(), 0, 0);
        while size < budget {
            let (batch, d) = tracer.take(conn, 64);
            dropped += d;
            if batch.is_empty() {
                break;
            }
            for t in batch {
                let path = self
                    .inodes
                    .path(t.nodeid)
                    .map(|p| p.to_string_lossy().into_owned());
                size += 64 + path.as_ref().map_or(0, |p| p.len());
                let target = t
                    .target
                    .as_ref()
                    .map(|n| String::from_utf8_lossy(n).into_owned());
                size += target.as_ref().map_or(0, |n| n.len());
                events.push(mapfs::stats::TraceEvent {
                    at_ns: t.at_ns,
                    at_unix_ns: t.at_unix_ns,
                    target,
                    op: crate::stats::OP_NAMES[t.op as usize].to_string(),
                    nodeid: t.nodeid,
                    path,
                    pid: t.pid,
                    latency_ns: t.latency_ns,
                    errno: t.errno,
                });
            }
        }
        Some((events, dropped))
    }

    fn trace_end(&self, conn: u64) {
        self.stats.tracer.unsubscribe(conn);
    }

    fn tool(&self, ctx: &mapfs::Ctx, name: &str, input: &[u8]) -> mapfs::Result<Vec<u8>> {
        tracing::info!(tool = name, uid = ctx.uid, pid = ctx.pid, "running a tool");
        self.fs.tool(ctx, name, input)
    }

    fn generations(&self) -> Option<&mapfs::mapcache::Generations> {
        self.tokens.generations()
    }

    fn adopting(&self, open: &OpenInfo) {
        if open.flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.pages.written_outside(self.inodes.fs_ino(open.ino));
        }
        self.stats.add(Event::Adoption, 1);
        self.tokens.adopting(open.ino, &open.map, &open.files);
    }

    fn has_writer(&self, ino: u64) -> bool {
        self.handles.has_writer(ino)
    }

    fn copied(&self) {
        self.stats.add(Event::Adoption, 1);
        self.stats.add(Event::Copy, 1);
    }

    fn lend(&self, fh: u64, lent: bool, size: Option<Arc<mapfs::lentsize::LentSize>>) {
        if lent {
            self.stats.add(Event::Lending, 1);
        }
        if let Some(f) = self.handles.file(fh) {
            if lent && f.flags & libc::O_ACCMODE != libc::O_RDONLY {
                self.pages.written_outside(self.inodes.fs_ino(f.ino));
            }
            f.lent.store(lent, Ordering::Release);
            let sized = lent && size.is_some();
            self.handles
                .lent_with_size(f.ino, fh, size.filter(|_| lent));
            if sized {
                // Attributes the kernel cached before the lending would hide
                // the client's size for up to a TTL.
                if let Some(n) = self.notifier.get() {
                    let _ = n.inval_inode(INodeNo(f.ino), -1, 0);
                    self.stats.add(Event::Invalidation, 1);
                }
            }
        }
    }

    fn client_released(&self, fh: u64, map: DataMap) {
        if let Some(f) = self.handles.file(fh) {
            let size = map.size();
            self.persist_journaled_of(f.ino);
            if f.data.whole_file_backing().is_none() {
                // The client wrote through its own engine over the same
                // backing files; adopt its final map so `release` persists it.
                let files = f.data.files();
                if let Err(e) = f.data.install(map, files) {
                    warn!(fh, "shim client's final map rejected: {e}");
                    return;
                }
            }
            self.changed(&f, SizeChange::Set(size));
            // Persisted now, not only at the kernel's FLUSH: the client also
            // pushes before it shrinks the file (see `FileSystem::flush`).
            if let Err(e) = self.persist_map(&f) {
                warn!(fh, "persisting a shim client's map: {e}");
            }
            self.tokens.bump(f.ino);
        }
    }
}
