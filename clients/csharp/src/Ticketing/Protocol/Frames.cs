using System;

namespace Ticketing.Protocol
{
    /// <summary>What is wrong with bytes that do not decode as a frame.</summary>
    public enum FrameError
    {
        /// <summary>An incomplete frame: on a stream, read more bytes (not an error).</summary>
        Short,

        /// <summary>The length field, <c>key_len</c> or <c>data_len</c> disagrees with the layout.</summary>
        Length,

        /// <summary>The length field is above the reader's ceiling (seen from the first 4 bytes).</summary>
        TooLarge,
    }

    /// <summary>Thrown by the decoders for bytes that are not a whole, well-formed frame.</summary>
    [Serializable]
    public sealed class FrameException : Exception
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="error">what is wrong</param>
        /// <param name="message">a description</param>
        public FrameException(FrameError error, string message)
            : base(message)
        {
            Error = error;
        }

        /// <summary>What is wrong with the bytes.</summary>
        public FrameError Error { get; }
    }

    /// <summary>Framing shared by requests and responses: a 4-byte length, then 28 + n bytes.</summary>
    public static class Frames
    {
        /// <summary>
        /// Returns the size of the frame that starts at <paramref name="offset"/> (length field
        /// included), or -1 when fewer than 4 bytes are there; checks the length against the layout
        /// and the ceiling <c>28 + maxVar</c> from those 4 bytes alone.
        /// </summary>
        /// <param name="buffer">the bytes</param>
        /// <param name="offset">where the frame starts</param>
        /// <param name="count">how many bytes are there from <paramref name="offset"/></param>
        /// <param name="maxVar">the reader's limit on the key or data length</param>
        /// <returns>4 + the length field, or -1</returns>
        /// <exception cref="FrameException">the length is below the header or above the ceiling</exception>
        public static int FrameSize(byte[] buffer, int offset, int count, int maxVar)
        {
            if (count < 4)
            {
                return -1;
            }
            uint len = BigEndian.ReadUInt32(buffer, offset);
            if (len > (uint)(Wire.Header - 4 + maxVar))
            {
                throw new FrameException(FrameError.TooLarge, "frame length " + len + " is above the limit of " + (Wire.Header - 4 + maxVar));
            }
            if (len < Wire.Header - 4)
            {
                throw new FrameException(FrameError.Length, "frame length " + len + " is below the 28 bytes of a header");
            }
            return (int)len + 4;
        }

        /// <summary>Checks a whole frame and returns its variable part's length.</summary>
        internal static int Check(byte[] buffer, int offset, int count, int maxVar, string what)
        {
            if (buffer == null)
            {
                throw new ArgumentNullException(nameof(buffer));
            }
            if (offset < 0 || count < 0 || offset + count > buffer.Length)
            {
                throw new ArgumentOutOfRangeException(nameof(count), "offset and count do not fit the buffer");
            }
            int size = FrameSize(buffer, offset, count, maxVar);
            if (size < 0 || count < size)
            {
                throw new FrameException(FrameError.Short, "incomplete frame: " + count + " bytes" + (size < 0 ? "" : " of " + size));
            }
            int n = BigEndian.ReadUInt16(buffer, offset + 6);
            if (n != size - Wire.Header)
            {
                throw new FrameException(FrameError.Length, what + " length " + n + " disagrees with the frame length " + (size - 4));
            }
            return n;
        }

        /// <summary>The empty data and key, shared (a zero-length array cannot change).</summary>
        internal static readonly byte[] Empty = new byte[0];

        internal static byte[] Slice(byte[] buffer, int offset, int count)
        {
            if (count == 0)
            {
                return Empty;
            }
            byte[] b = new byte[count];
            Buffer.BlockCopy(buffer, offset, b, 0, count);
            return b;
        }
    }

    /// <summary>A request (client to server): a 32-byte header, then the key.</summary>
    public sealed class RequestFrame
    {
        /// <summary>Creates a request.</summary>
        /// <param name="op">the operation</param>
        /// <param name="requestId">the request id (non-zero on the wire)</param>
        /// <param name="token">the token, or the request id to cancel, or the ACK bound</param>
        /// <param name="leaseMs">the lease, ms</param>
        /// <param name="waitMs">the wait timeout, ms (<see cref="Wire.WaitForever"/>: without limit)</param>
        /// <param name="key">the key (empty for ops without one)</param>
        /// <param name="flags">reserved: 0</param>
        public RequestFrame(Op op, ulong requestId, ulong token, uint leaseMs, uint waitMs, byte[] key, byte flags = 0)
        {
            Op = op;
            RequestId = requestId;
            Token = token;
            LeaseMs = leaseMs;
            WaitMs = waitMs;
            Key = key ?? Frames.Empty;
            Flags = flags;
            if (Key.Length > Wire.MaxKeyLen)
            {
                throw new ArgumentOutOfRangeException(nameof(key), "key is longer than " + Wire.MaxKeyLen + " bytes");
            }
        }

        /// <summary>The operation (any byte: unknown ops are kept as received).</summary>
        public Op Op { get; }

        /// <summary>Reserved flags.</summary>
        public byte Flags { get; }

        /// <summary>The request id.</summary>
        public ulong RequestId { get; }

        /// <summary>The token field.</summary>
        public ulong Token { get; }

        /// <summary>The lease, ms.</summary>
        public uint LeaseMs { get; }

        /// <summary>The wait timeout, ms.</summary>
        public uint WaitMs { get; }

        /// <summary>The key's bytes.</summary>
        public byte[] Key { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>32 + key length bytes</returns>
        public byte[] Encode()
        {
            return Encode(Op, Flags, RequestId, Token, LeaseMs, WaitMs, Key);
        }

        /// <summary>The bytes of a request with these fields (the key's length checked by the caller), without a frame object.</summary>
        internal static byte[] Encode(Op op, byte flags, ulong requestId, ulong token, uint leaseMs, uint waitMs, byte[] key)
        {
            byte[] b = new byte[Wire.Header + key.Length];
            EncodeTo(b, 0, op, flags, requestId, token, leaseMs, waitMs, key);
            return b;
        }

        /// <summary>
        /// Writes a request with these fields at <paramref name="at"/> of <paramref name="b"/>, which
        /// has room for <c>Wire.Header</c> + the key's length (the key's length checked by the caller).
        /// </summary>
        internal static void EncodeTo(byte[] b, int at, Op op, byte flags, ulong requestId, ulong token, uint leaseMs, uint waitMs, byte[] key)
        {
            BigEndian.WriteUInt32(b, at, (uint)(Wire.Header - 4 + key.Length));
            b[at + 4] = (byte)op;
            b[at + 5] = flags;
            BigEndian.WriteUInt16(b, at + 6, (ushort)key.Length);
            BigEndian.WriteUInt64(b, at + 8, requestId);
            BigEndian.WriteUInt64(b, at + 16, token);
            BigEndian.WriteUInt32(b, at + 24, leaseMs);
            BigEndian.WriteUInt32(b, at + 28, waitMs);
            Buffer.BlockCopy(key, 0, b, at + Wire.Header, key.Length);
        }

        /// <summary>Decodes one whole request frame.</summary>
        /// <param name="buffer">the bytes</param>
        /// <param name="offset">where the frame starts</param>
        /// <param name="count">the bytes available from <paramref name="offset"/></param>
        /// <param name="maxKeyLength">the reader's limit on the key length</param>
        /// <returns>the request</returns>
        /// <exception cref="FrameException">incomplete or malformed</exception>
        public static RequestFrame Decode(byte[] buffer, int offset, int count, int maxKeyLength)
        {
            int n = Frames.Check(buffer, offset, count, maxKeyLength, "key");
            return new RequestFrame(
                (Op)buffer[offset + 4],
                BigEndian.ReadUInt64(buffer, offset + 8),
                BigEndian.ReadUInt64(buffer, offset + 16),
                BigEndian.ReadUInt32(buffer, offset + 24),
                BigEndian.ReadUInt32(buffer, offset + 28),
                Frames.Slice(buffer, offset + Wire.Header, n),
                buffer[offset + 5]);
        }
    }

    /// <summary>A response or push (server to client): a 32-byte header, then data.</summary>
    public sealed class ResponseFrame
    {
        /// <summary>Creates a response.</summary>
        /// <param name="op">the request's op, or a push op</param>
        /// <param name="status">the status (any byte: unknown ones are kept)</param>
        /// <param name="requestId">the request's id; 0 for pushes</param>
        /// <param name="token">the token field</param>
        /// <param name="leaseMs">the lease field, ms</param>
        /// <param name="detail">the detail field</param>
        /// <param name="data">the data (empty when none)</param>
        public ResponseFrame(Op op, Status status, ulong requestId, ulong token, uint leaseMs, uint detail, byte[] data)
        {
            Op = op;
            Status = status;
            RequestId = requestId;
            Token = token;
            LeaseMs = leaseMs;
            Detail = detail;
            Data = data ?? Frames.Empty;
            if (Data.Length > Wire.MaxDataLen)
            {
                throw new ArgumentOutOfRangeException(nameof(data), "data is longer than " + Wire.MaxDataLen + " bytes");
            }
        }

        /// <summary>The op.</summary>
        public Op Op { get; }

        /// <summary>The status.</summary>
        public Status Status { get; }

        /// <summary>The request id (0 for pushes and <c>INVALID</c>/<c>LENGTH</c>).</summary>
        public ulong RequestId { get; }

        /// <summary>The token field.</summary>
        public ulong Token { get; }

        /// <summary>The lease field, ms.</summary>
        public uint LeaseMs { get; }

        /// <summary>The detail field.</summary>
        public uint Detail { get; }

        /// <summary>The data.</summary>
        public byte[] Data { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>32 + data length bytes</returns>
        public byte[] Encode()
        {
            byte[] b = new byte[Wire.Header + Data.Length];
            BigEndian.WriteUInt32(b, 0, (uint)(b.Length - 4));
            b[4] = (byte)Op;
            b[5] = (byte)Status;
            BigEndian.WriteUInt16(b, 6, (ushort)Data.Length);
            BigEndian.WriteUInt64(b, 8, RequestId);
            BigEndian.WriteUInt64(b, 16, Token);
            BigEndian.WriteUInt32(b, 24, LeaseMs);
            BigEndian.WriteUInt32(b, 28, Detail);
            Buffer.BlockCopy(Data, 0, b, Wire.Header, Data.Length);
            return b;
        }

        /// <summary>Decodes one whole response frame.</summary>
        /// <param name="buffer">the bytes</param>
        /// <param name="offset">where the frame starts</param>
        /// <param name="count">the bytes available from <paramref name="offset"/></param>
        /// <param name="maxDataLength">the reader's limit on the data length</param>
        /// <returns>the response</returns>
        /// <exception cref="FrameException">incomplete or malformed</exception>
        public static ResponseFrame Decode(byte[] buffer, int offset, int count, int maxDataLength)
        {
            int n = Frames.Check(buffer, offset, count, maxDataLength, "data");
            return new ResponseFrame(
                (Op)buffer[offset + 4],
                (Status)buffer[offset + 5],
                BigEndian.ReadUInt64(buffer, offset + 8),
                BigEndian.ReadUInt64(buffer, offset + 16),
                BigEndian.ReadUInt32(buffer, offset + 24),
                BigEndian.ReadUInt32(buffer, offset + 28),
                Frames.Slice(buffer, offset + Wire.Header, n));
        }
    }
}
