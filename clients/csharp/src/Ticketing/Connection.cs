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

        /// <summary>Makes <paramref name="n"/> bytes available; false at the end of the stream.</summary>
        private async Task<bool> FillAsync(int n)
        {
            while (_end - _start < n)
            {
                if (_buf.Length - _start < n)
                {
                    byte[] nb = _buf.Length >= n ? _buf : new byte[Math.Max(n, _buf.Length * 2)];
                    Buffer.BlockCopy(_buf, _start, nb, 0, _end - _start);
                    _end -= _start;
                    _start = 0;
                    _buf = nb;
                }
                int got = await _stream.ReadAsync(_buf, _end, _buf.Length - _end).ConfigureAwait(false);
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
    }

    /// <summary>
    /// One established connection (after <c>WELCOME</c>): a read loop that decodes every frame and
    /// hands it to the engine, and a write loop that sends queued frames in order, many per write.
    /// Neither loop holds a lock during I/O; <c>_queue</c>'s monitor guards only the queue.
    /// </summary>
    internal sealed class Connection
    {
        private const int MaxBatch = 64 * 1024;

        private readonly Socket _socket;
        private readonly Stream _stream;
        private readonly FrameReader _reader;
        private readonly IConnectionListener _listener;
        private readonly Queue<byte[]> _queue = new Queue<byte[]>(); // guarded by itself
        private readonly SemaphoreSlim _wake = new SemaphoreSlim(0);
        private bool _closed; // guarded by _queue
        private long _lastReceive = Stopwatch.GetTimestamp();

        internal Connection(Dialer.Dialed d, IConnectionListener listener)
        {
            Endpoint = d.Endpoint;
            _socket = d.Socket;
            _stream = d.Stream;
            _reader = d.Reader;
            _listener = listener;
        }

        internal Endpoint Endpoint { get; }

        /// <summary>The <see cref="Stopwatch"/> timestamp of the last frame received.</summary>
        internal long LastReceive => Interlocked.Read(ref _lastReceive);

        internal void Start()
        {
            Task.Run(ReadLoopAsync);
            Task.Run(WriteLoopAsync);
        }

        /// <summary>Queues a frame; frames reach the wire in the order queued.</summary>
        internal void Enqueue(byte[] frame)
        {
            lock (_queue)
            {
                if (_closed)
                {
                    return;
                }
                _queue.Enqueue(frame);
            }
            _wake.Release();
        }

        /// <summary>Closes the socket; both loops end. Idempotent.</summary>
        internal void Close()
        {
            lock (_queue)
            {
                if (_closed)
                {
                    return;
                }
                _closed = true;
                _queue.Clear();
            }
            _wake.Release();
            Dialer.Abort(_socket, _stream);
        }

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
            catch (FrameException e)
            {
                failure = new ProtocolException("malformed frame from " + Endpoint + ": " + e.Message, e);
            }
            catch (Exception e) when (e is IOException || e is SocketException || e is ObjectDisposedException)
            {
                failure = new ConnectionLostException("connection to " + Endpoint + " lost: " + e.Message, e);
            }
            catch (Exception e)
            {
                failure = new ProtocolException("cannot handle a frame from " + Endpoint + ": " + e.Message, e);
            }
            _listener.OnFailure(this, failure);
        }

        private async Task WriteLoopAsync()
        {
            byte[] batch = new byte[MaxBatch];
            try
            {
                while (true)
                {
                    await _wake.WaitAsync().ConfigureAwait(false);
                    int n = 0;
                    byte[] big = null;
                    lock (_queue)
                    {
                        if (_closed)
                        {
                            return;
                        }
                        while (_queue.Count > 0)
                        {
                            byte[] f = _queue.Peek();
                            if (f.Length > MaxBatch - n)
                            {
                                if (n == 0)
                                {
                                    big = _queue.Dequeue();
                                }
                                break;
                            }
                            _queue.Dequeue();
                            Buffer.BlockCopy(f, 0, batch, n, f.Length);
                            n += f.Length;
                        }
                        if (_queue.Count > 0)
                        {
                            _wake.Release(); // more than one batch: come back at once
                        }
                    }
                    if (big != null)
                    {
                        await _stream.WriteAsync(big, 0, big.Length).ConfigureAwait(false);
                    }
                    else if (n > 0)
                    {
                        await _stream.WriteAsync(batch, 0, n).ConfigureAwait(false);
                    }
                    else
                    {
                        continue;
                    }
                    await _stream.FlushAsync().ConfigureAwait(false);
                }
            }
            catch (Exception e)
            {
                _listener.OnFailure(this, new ConnectionLostException("connection to " + Endpoint + " lost while writing: " + e.Message, e));
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
