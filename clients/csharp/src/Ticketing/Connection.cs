using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Net.Sockets;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// Reads whole frames from a stream through one buffer, so that the handshake and the frames
    /// after it share it (bytes that arrive early are kept). Not safe for concurrent use.
    /// </summary>
    internal sealed class FrameReader
    {
        private readonly Stream _stream;
        private byte[] _buf = new byte[16 * 1024];
        private int _start;
        private int _end;

        internal FrameReader(Stream stream)
        {
            _stream = stream;
        }

        /// <summary>Makes room for <paramref name="n"/> bytes from _start: the unread bytes move to the front, into a larger buffer if needed.</summary>
        private void MakeRoom(int n)
        {
            if (_buf.Length - _start < n)
            {
                byte[] nb = _buf.Length >= n ? _buf : new byte[Math.Max(n, _buf.Length * 2)];
                Buffer.BlockCopy(_buf, _start, nb, 0, _end - _start);
                _end -= _start;
                _start = 0;
                _buf = nb;
            }
        }

        /// <summary>Makes <paramref name="n"/> bytes available; false at the end of the stream.</summary>
        private async Task<bool> FillAsync(int n)
        {
            while (_end - _start < n)
            {
                MakeRoom(n);
                int got = await _stream.ReadAsync(_buf, _end, _buf.Length - _end).ConfigureAwait(false);
                if (got <= 0)
                {
                    return false;
                }
                _end += got;
            }
            return true;
        }

        /// <summary>
        /// Like <see cref="FillAsync"/>, with blocking reads: the connection's own reader thread
        /// reads this way (an async read on Mono costs two thread switches: its I/O selector
        /// thread, then a pool thread).
        /// </summary>
        private bool Fill(int n)
        {
            while (_end - _start < n)
            {
                MakeRoom(n);
                int got = _stream.Read(_buf, _end, _buf.Length - _end);
                if (got <= 0)
                {
                    return false;
                }
                _end += got;
            }
            return true;
        }

        /// <summary>Returns the next <paramref name="n"/> bytes without consuming them, or null at the end of the stream.</summary>
        internal async Task<byte[]> PeekAsync(int n)
        {
            if (!await FillAsync(n).ConfigureAwait(false))
            {
                return null;
            }
            return Frames.Slice(_buf, _start, n);
        }

        /// <summary>Returns the next <paramref name="n"/> bytes, or null at the end of the stream.</summary>
        internal async Task<byte[]> ReadExactAsync(int n)
        {
            if (!await FillAsync(n).ConfigureAwait(false))
            {
                return null;
            }
            byte[] r = Frames.Slice(_buf, _start, n);
            _start += n;
            return r;
        }

        /// <summary>Reads the next response frame; null when the stream ends between frames.</summary>
        internal async Task<ResponseFrame> ReadFrameAsync()
        {
            if (!await FillAsync(4).ConfigureAwait(false))
            {
                if (_end > _start)
                {
                    throw new EndOfStreamException("the stream ended inside a frame");
                }
                return null;
            }
            int size = Frames.FrameSize(_buf, _start, _end - _start, Wire.MaxDataLen);
            if (!await FillAsync(size).ConfigureAwait(false))
            {
                throw new EndOfStreamException("the stream ended inside a frame");
            }
            ResponseFrame f = ResponseFrame.Decode(_buf, _start, size, Wire.MaxDataLen);
            _start += size;
            if (_start == _end)
            {
                _start = _end = 0;
            }
            return f;
        }

        /// <summary>Tells whether a whole frame is buffered already (the next <see cref="ReadFrame"/> does not block).</summary>
        internal bool HasFrame
        {
            get
            {
                int have = _end - _start;
                return have >= 4 && have >= Frames.FrameSize(_buf, _start, have, Wire.MaxDataLen);
            }
        }

        /// <summary>Reads the next response frame, blocking; null when the stream ends between frames.</summary>
        internal ResponseFrame ReadFrame()
        {
            if (!Fill(4))
            {
                if (_end > _start)
                {
                    throw new EndOfStreamException("the stream ended inside a frame");
                }
                return null;
            }
            int size = Frames.FrameSize(_buf, _start, _end - _start, Wire.MaxDataLen);
            if (!Fill(size))
            {
                throw new EndOfStreamException("the stream ended inside a frame");
            }
            ResponseFrame f = ResponseFrame.Decode(_buf, _start, size, Wire.MaxDataLen);
            _start += size;
            if (_start == _end)
            {
                _start = _end = 0;
            }
            return f;
        }
    }

    /// <summary>
    /// One established connection (after <c>WELCOME</c>): a reader thread that decodes every frame,
    /// hands it to the engine and runs the completions of the answers, and a writer role that
    /// sends queued frames in order, many per write.
    /// </summary>
    /// <remarks>
    /// <para><b>Reading.</b> A background thread of the connection's own reads with blocking
    /// reads. On Mono an async socket read goes through the runtime's I/O selector thread and
    /// then a pool thread, and a completion handed to the pool wakes a second pool thread (Mono's
    /// pool asks for one more worker each time one takes an item): five or six thread switches
    /// per request, which were most of the client's cost.</para>
    /// <para><b>Completions.</b> The reader decodes every frame that is buffered, then runs the
    /// completions of those answers itself, outside every lock: the awaiting callers go on at
    /// once, on this thread, with no hand-off. A continuation that blocks or runs long must not
    /// stall the client (a caller may even block on another answer of this connection): a
    /// watchdog on the timer thread checks every <see cref="WatchdogMs"/> while completions run,
    /// and when one completion has run through a whole check interval it gives the reading, and
    /// the completions still due, to a new thread. The thread that ran long ends when its
    /// continuation returns. So an answer waits at most about 2 · <see cref="WatchdogMs"/> behind
    /// a continuation, and never on one that blocks.</para>
    /// <para><b>Writing.</b> Frames are queued in order (under the engine's lock, so in request id
    /// order), encoded straight into one buffer. Whoever finds no writer at work becomes the writer: it takes every queued frame,
    /// sends them in one blocking write, and goes on until the queue is empty, so that frames
    /// queued while it writes go out together in its next write. The caller of a request is
    /// usually that writer (<see cref="Flush"/>, after the engine's lock is let go): its frame
    /// goes out on its own thread, with no thread switch. While the reader runs a batch of
    /// completions, the frames they queue are sent together after the batch (one write, not one
    /// per caller). Frames the client sends for itself (keep-alive's EXTEND, heartbeat, ACK,
    /// re-sends after a reconnect) are flushed by the connection's own writer thread, never the
    /// pool (<see cref="Kick"/>). A blocking write
    /// waits only while the socket's send buffer is full: a server that stops reading for that
    /// long misses the heartbeat, and the connection is then closed, which ends the write.</para>
    /// <para><b>TLS.</b> A TLS connection keeps the async read loop, and its answers complete on the
    /// pool; writing is the same. With blocking reads of Mono's <c>SslStream</c> against concurrent
    /// writes, two full test runs had TLS calls stall for seconds (the cause is not established:
    /// a single test that writes while the reader blocks passes either way), so TLS stays on the
    /// path that was proven.</para>
    /// <para>No lock is held during I/O or while a completion runs; <c>_queue</c>'s monitor guards
    /// the queue and the writer flag, <c>_rd</c>'s the reader role.</para>
    /// </remarks>
    internal sealed class Connection
    {
        /// <summary>
        /// The watchdog's interval: a completion that runs through a whole interval (between one
        /// and two of them) loses the reader role to a new thread.
        /// </summary>
        internal const int WatchdogMs = 10;

        /// <summary>The write buffers' size to start with, and the size a larger one shrinks back to after its write.</summary>
        private const int BufferSize = 16 * 1024;

        /// <summary>The connection whose reader role this thread holds while it hands a frame to the engine: its completions are deferred to it.</summary>
        [ThreadStatic]
        private static Connection _decoding;

        /// <summary>The connection whose completions this thread runs now, as its reader (its writes are batched).</summary>
        [ThreadStatic]
        private static Connection _completing;

        private readonly Socket _socket;
        private readonly Stream _stream;
        private readonly FrameReader _reader;
        private readonly IConnectionListener _listener;
        private readonly object _queue = new object(); // guards the queued frames and the writer's flags
        // The queued frames, encoded back to back in the order queued (guarded by _queue): the writer
        // swaps this buffer with its own and writes it outside the lock, so a frame costs neither
        // an array of its own nor a copy into a batch.
        private byte[] _pending = new byte[BufferSize];
        private int _pendingLen; // guarded by _queue
        private byte[] _spare = new byte[BufferSize]; // the writer's: swapped with _pending under _queue (null during its write)
        private readonly Action _watchdogTick;
        private bool _writing; // guarded by _queue: a thread holds the writer role
        private bool _flushQueued; // guarded by _queue: the writer thread is asked to flush
        private bool _closed; // guarded by _queue
        private long _lastReceive = Stopwatch.GetTimestamp();

        private readonly object _rd = new object();
        private readonly Queue<ICompletion> _due = new Queue<ICompletion>(); // guarded by _rd: completions the reader runs next
        private int _role; // guarded by _rd: bumped when the reader role moves to another thread
        private bool _running; // guarded by _rd: the reader runs a completion
        private long _started; // guarded by _rd: completions started so far
        private long _startedAtTick; // guarded by _rd: _started at the watchdog's last check
        private TimerEntry _watchdog; // guarded by _rd: armed while completions run
        private int _readers; // guarded by _rd: threads started for the reader role (for tests)

        internal Connection(Dialer.Dialed d, IConnectionListener listener)
        {
            Endpoint = d.Endpoint;
            _socket = d.Socket;
            _stream = d.Stream;
            _reader = d.Reader;
            _listener = listener;
            _watchdogTick = WatchdogTick;
        }

        internal Endpoint Endpoint { get; }

        /// <summary>The <see cref="Stopwatch"/> timestamp of the last frame received.</summary>
        internal long LastReceive => Interlocked.Read(ref _lastReceive);

        /// <summary>Threads started for the reader role so far: 1, and one more each time the watchdog moved it (for tests).</summary>
        internal int ReaderThreads
        {
            get
            {
                lock (_rd)
                {
                    return _readers;
                }
            }
        }

        internal void Start()
        {
            // Started with the connection, not at the first frame it sends: starting a thread took
            // up to 90 ms on a loaded machine, too long for a keep-alive's EXTEND to wait.
            var writer = new Thread(WriterLoop) { IsBackground = true, Name = "Ticketing writer " + Endpoint };
            using (ExecutionContext.SuppressFlow())
            {
                writer.Start();
            }
            if (!(_stream is NetworkStream))
            {
                // TLS keeps the async read loop, and its completions run on the pool (the class's
                // remarks: blocking reads of Mono's SslStream against concurrent writes were not
                // shown to be safe).
                Task.Run(ReadLoopAsync);
                return;
            }
            lock (_rd)
            {
                StartReaderLocked();
            }
        }

        /// <summary>The read loop of a TLS connection (<see cref="Start"/>): async reads; completions on the pool.</summary>
        private async Task ReadLoopAsync()
        {
            TicketingException failure;
            try
            {
                while (true)
                {
                    ResponseFrame f = await _reader.ReadFrameAsync().ConfigureAwait(false);
                    if (f == null)
                    {
                        failure = new ConnectionLostException("connection to " + Endpoint + " closed by the server");
                        break;
                    }
                    Interlocked.Exchange(ref _lastReceive, Stopwatch.GetTimestamp());
                    _listener.OnFrame(this, f);
                }
            }
            catch (Exception e)
            {
                failure = ReadFailure(e);
            }
            _listener.OnFailure(this, failure);
        }

        /// <summary>What a read loop's exception means for the connection (both read loops).</summary>
        private TicketingException ReadFailure(Exception e)
        {
            if (e is FrameException)
            {
                return new ProtocolException("malformed frame from " + Endpoint + ": " + e.Message, e);
            }
            if (e is IOException || e is SocketException || e is ObjectDisposedException)
            {
                return new ConnectionLostException("connection to " + Endpoint + " lost: " + e.Message, e);
            }
            return new ProtocolException("cannot handle a frame from " + Endpoint + ": " + e.Message, e);
        }

        /// <summary>_rd must be held. Starts a thread that holds the reader role from now on.</summary>
        private void StartReaderLocked()
        {
            int role = ++_role;
            _readers++;
            // A background thread: it never keeps the process alive, and it ends with the socket.
            // Without the starting caller's execution context (its AsyncLocal values): the thread
            // serves every caller, each continuation restoring its own context.
            var t = new Thread(() => ReadLoop(role)) { IsBackground = true, Name = "Ticketing reader " + Endpoint };
            using (ExecutionContext.SuppressFlow())
            {
                t.Start();
            }
        }

        /// <summary>
        /// Defers <paramref name="c"/> to the reader that is handing a frame to the engine on this
        /// thread: it runs once the engine's lock is let go. False on any other thread.
        /// </summary>
        internal static bool TryDefer(ICompletion c)
        {
            Connection conn = _decoding;
            if (conn == null)
            {
                return false;
            }
            lock (conn._rd)
            {
                conn._due.Enqueue(c);
            }
            return true;
        }

        /// <summary>
        /// Queues a frame and makes sure it is sent: by the writer at work, else by the writer
        /// thread (<see cref="Kick"/>). Frames reach the wire in the order queued.
        /// </summary>
        internal void Enqueue(Request r)
        {
            lock (_queue)
            {
                if (_closed)
                {
                    return;
                }
                AppendLocked(r);
            }
            Kick();
        }

        /// <summary>_queue must be held. Encodes <paramref name="r"/>'s frame after those queued.</summary>
        private void AppendLocked(Request r)
        {
            int size = r.FrameSize;
            if (_pending.Length - _pendingLen < size)
            {
                byte[] larger = new byte[Math.Max(_pending.Length * 2, _pendingLen + size)];
                Buffer.BlockCopy(_pending, 0, larger, 0, _pendingLen);
                _pending = larger;
            }
            r.EncodeTo(_pending, _pendingLen);
            _pendingLen += size;
        }

        /// <summary>
        /// Makes sure the queued frames are sent without writing on this thread: by the writer at
        /// work, else by the connection's writer thread, which this wakes. Never blocks on the
        /// socket.
        /// </summary>
        /// <remarks>
        /// The frames the client sends for itself are made where no caller waits to write them:
        /// keep-alive's <c>EXTEND</c> and the heartbeat's <c>PING</c> on the timer thread, which must
        /// never wait for the socket (the heartbeat that ends a write stuck on a server that stopped
        /// reading runs there); <c>ACK</c>s on the reader thread; re-sends after a reconnect. They
        /// used to be flushed by a thread pool work item, and under load Mono's pool ran it 250 ms
        /// and more late (in a test that blocks the pool's threads, never within 5 s): a keep-alive
        /// <c>EXTEND</c> that leaves late can lose a lock the application still holds. So each
        /// connection has a thread of its own for them, idle on <c>_queue</c>'s monitor until woken
        /// here: it owes nothing to the pool, and a blocking write on it (TLS included: an
        /// <c>SslStream</c> has no partial non-blocking write) waits no longer than the pool's did
        /// and is ended the same way, by the heartbeat closing the connection. Sending from the
        /// timer thread itself when the socket is writable (<c>Socket.Poll</c>, then a send that
        /// takes what it can, the rest handed over) would save the thread switch, but needs this
        /// thread anyway for TLS and for a partial send, and these frames are a few per lease
        /// or heartbeat interval: not worth a second path. The request path is unchanged: a
        /// caller writes its own frame (<see cref="Flush"/>).
        /// </remarks>
        private void Kick()
        {
            lock (_queue)
            {
                if (_closed || _pendingLen == 0 || _writing || _flushQueued)
                {
                    return; // nothing to send, or the writer at work, or the writer thread woken already, takes it
                }
                _flushQueued = true;
                Monitor.Pulse(_queue); // only the writer thread waits on _queue
            }
        }

        /// <summary>
        /// The connection's writer thread (<see cref="Kick"/>): a background thread that flushes
        /// each time it is woken, and ends when the connection closes (<see cref="Close"/> wakes it).
        /// </summary>
        private void WriterLoop()
        {
            try
            {
                while (true)
                {
                    lock (_queue)
                    {
                        while (!_flushQueued && !_closed)
                        {
                            Monitor.Wait(_queue);
                        }
                        if (_closed)
                        {
                            return;
                        }
                        _flushQueued = false;
                    }
                    Flush();
                }
            }
            catch (Exception e)
            {
                // Flush never throws; an exception would end the process on a thread of our own.
                Engine.Log.TraceEvent(TraceEventType.Error, 0, "the writer thread of {0} failed: {1}", Endpoint, e);
            }
        }

        /// <summary>
        /// Queues a frame that the caller sends itself with <see cref="Flush"/> once it holds no
        /// lock (the engine queues under its lock, in request id order).
        /// </summary>
        internal void EnqueueForFlush(Request r)
        {
            lock (_queue)
            {
                if (!_closed)
                {
                    AppendLocked(r);
                }
            }
        }

        /// <summary>
        /// Takes the writer role unless another thread holds it, and sends every queued frame
        /// (also those queued meanwhile). Call it holding no lock: it writes to the socket. A
        /// write error closes the connection (the engine hears of it); it never throws. Inside a
        /// completion that the reader runs, with more completions due after it, it leaves the
        /// frames queued: the reader sends them all after the batch.
        /// </summary>
        internal void Flush()
        {
            if (TimerQueue.OnTimerThread)
            {
                // A timer action (keep-alive's extend) must not wait for the socket: the heartbeat,
                // which would end a write stuck on a server that stopped reading, runs there too.
                // The connection's writer thread sends it (Kick's remarks).
                Kick();
                return;
            }
            if (_completing == this)
            {
                lock (_rd)
                {
                    if (_due.Count > 0)
                    {
                        return; // the reader flushes after the batch
                    }
                }
            }
            lock (_queue)
            {
                if (_writing || _closed || _pendingLen == 0)
                {
                    return; // the writer at work sends what was queued, or nothing is left
                }
                _writing = true;
            }
            try
            {
                while (true)
                {
                    byte[] batch;
                    int n;
                    lock (_queue)
                    {
                        if (_closed || _pendingLen == 0)
                        {
                            _writing = false;
                            return;
                        }
                        // Every frame queued so far, in one write; frames queued meanwhile go into
                        // the other buffer, for the next.
                        batch = _pending;
                        n = _pendingLen;
                        _pending = _spare;
                        _spare = null; // the writer's again after the write
                        _pendingLen = 0;
                    }
                    _stream.Write(batch, 0, n);
                    _stream.Flush();
                    // Only the writer touches _spare (the writer role is held); a buffer that grew for
                    // a burst (or a long key) is not kept.
                    _spare = batch.Length > BufferSize ? new byte[BufferSize] : batch;
                }
            }
            catch (Exception e)
            {
                lock (_queue)
                {
                    _spare = _spare ?? new byte[BufferSize]; // the failed write's buffer may be half sent
                    _writing = false;
                }
                _listener.OnFailure(this, new ConnectionLostException("connection to " + Endpoint + " lost while writing: " + e.Message, e));
            }
        }

        /// <summary>Closes the socket; the reader thread and any write end. Idempotent.</summary>
        internal void Close()
        {
            lock (_queue)
            {
                if (_closed)
                {
                    return;
                }
                _closed = true;
                _pendingLen = 0;
                Monitor.Pulse(_queue); // the writer thread ends
            }
            try
            {
                // Wakes the reader thread's blocking read (and a blocked write) at once.
                _socket?.Shutdown(SocketShutdown.Both);
            }
            catch (Exception)
            {
                // not connected any more: closing anyway
            }
            Dialer.Abort(_socket, _stream);
        }

        private bool IsClosed
        {
            get
            {
                lock (_queue)
                {
                    return _closed;
                }
            }
        }

        private void ReadLoop(int role)
        {
            TicketingException failure;
            try
            {
                while (true)
                {
                    // The completions due (a new reader starts with those its predecessor left),
                    // then what they queued, in one write.
                    if (!RunDue(role) || !FlushAfterBatch(role))
                    {
                        return; // the watchdog gave the reading to another thread
                    }
                    bool read = true; // the first frame may need a read; those after it came with it
                    do
                    {
                        ResponseFrame f = _reader.ReadFrame();
                        if (f == null)
                        {
                            failure = new ConnectionLostException("connection to " + Endpoint + " closed by the server");
                            goto failed;
                        }
                        if (read)
                        {
                            // Once per read, not per frame: the frames of one read arrived together.
                            Interlocked.Exchange(ref _lastReceive, Stopwatch.GetTimestamp());
                            read = false;
                        }
                        _decoding = this;
                        try
                        {
                            _listener.OnFrame(this, f);
                        }
                        finally
                        {
                            _decoding = null;
                        }
                    }
                    while (_reader.HasFrame); // a whole batch first: its answers' frames go out together
                }
            }
            catch (Exception e)
            {
                failure = ReadFailure(e);
            }
            failed:
            // The completions of the frames handled before the failure still run.
            if (!RunDue(role))
            {
                return;
            }
            try
            {
                _listener.OnFailure(this, failure);
            }
            catch (Exception e)
            {
                // An exception would end the process on a thread of our own.
                Engine.Log.TraceEvent(TraceEventType.Error, 0, "handling the end of a connection failed: {0}", e);
            }
        }

        /// <summary>
        /// Sends what the batch's completions queued, watched like a completion: a write that
        /// waits on a full send buffer (a server that stops reading until it can write its answers
        /// to this client) must not keep this thread from reading, or neither side would move.
        /// False once this thread lost the reader role.
        /// </summary>
        private bool FlushAfterBatch(int role)
        {
            lock (_queue)
            {
                if (_pendingLen == 0 || _writing || _closed)
                {
                    return true; // the common case: the last completion of the batch sent it all
                }
            }
            lock (_rd)
            {
                if (_role != role)
                {
                    return false;
                }
                _running = true;
                _started++;
                ArmWatchdogLocked();
            }
            Flush();
            lock (_rd)
            {
                if (_role != role)
                {
                    return false; // _running is the new reader's now
                }
                _running = false;
                return true;
            }
        }

        /// <summary>_rd must be held. Arms the watchdog unless it is armed.</summary>
        private void ArmWatchdogLocked()
        {
            if (_watchdog == null)
            {
                _startedAtTick = _started - 1;
                _watchdog = Clock.Once(WatchdogMs, _watchdogTick);
            }
        }

        /// <summary>
        /// Runs the completions due, one by one, while this thread holds the reader role
        /// <paramref name="role"/>; false once it lost it (to the watchdog, during a completion
        /// that ran long).
        /// </summary>
        private bool RunDue(int role)
        {
            while (true)
            {
                ICompletion c;
                lock (_rd)
                {
                    if (_role != role)
                    {
                        return false; // _running is the new reader's now
                    }
                    _running = false;
                    if (_due.Count == 0)
                    {
                        return true;
                    }
                    c = _due.Dequeue();
                    _running = true;
                    _started++;
                    ArmWatchdogLocked();
                }
                _completing = this;
                try
                {
                    Completions.RunSafely(c);
                }
                finally
                {
                    _completing = null;
                }
            }
        }

        /// <summary>
        /// On the timer thread, every <see cref="WatchdogMs"/> while completions run: when the same
        /// completion has been running since the last check, a new thread takes the reader role
        /// (and the completions still due). Stops after a check that saw none run.
        /// </summary>
        private void WatchdogTick()
        {
            bool closed = IsClosed; // taken before _rd: _queue is never taken under _rd
            lock (_rd)
            {
                if (closed || (!_running && _started == _startedAtTick))
                {
                    _watchdog = null; // quiet (or closed): the next completion arms it again
                    return;
                }
                if (_running && _started == _startedAtTick)
                {
                    Engine.Log.TraceEvent(TraceEventType.Verbose, 0,
                        "a continuation ran on the reader thread of {0} for more than {1} ms: another thread reads now", Endpoint, WatchdogMs);
                    _running = false;
                    StartReaderLocked();
                }
                _startedAtTick = _started;
                _watchdog = Clock.Once(WatchdogMs, _watchdogTick);
            }
        }
    }

    /// <summary>Receives what a <see cref="Connection"/> reads, and its end.</summary>
    internal interface IConnectionListener
    {
        /// <summary>A frame arrived (called on the read loop; must not block).</summary>
        void OnFrame(Connection c, ResponseFrame f);

        /// <summary>The connection failed or closed (called once or more; only the first matters).</summary>
        void OnFailure(Connection c, TicketingException cause);
    }
}
