using System;
using System.Security.Cryptography;
using System.Text;

namespace Ticketing.Protocol
{
    /// <summary><c>HELLO</c> (client to server), 56 bytes.</summary>
    public sealed class HelloFrame
    {
        /// <summary>Creates a <c>HELLO</c>.</summary>
        /// <param name="version">the protocol version</param>
        /// <param name="flags">reserved: 0</param>
        /// <param name="sessionId">16 bytes</param>
        /// <param name="clientNonce">32 bytes</param>
        public HelloFrame(byte version, ushort flags, byte[] sessionId, byte[] clientNonce)
        {
            Version = version;
            Flags = flags;
            SessionId = Handshake.Exactly(sessionId, Wire.SessionId, nameof(sessionId));
            ClientNonce = Handshake.Exactly(clientNonce, Wire.Nonce, nameof(clientNonce));
        }

        /// <summary>The protocol version.</summary>
        public byte Version { get; }

        /// <summary>Reserved flags.</summary>
        public ushort Flags { get; }

        /// <summary>The session id.</summary>
        public byte[] SessionId { get; }

        /// <summary>The client nonce.</summary>
        public byte[] ClientNonce { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>56 bytes</returns>
        public byte[] Encode()
        {
            byte[] b = new byte[Wire.Hello];
            BigEndian.WriteUInt32(b, 0, Wire.Hello - 4);
            b[4] = (byte)Op.Hello;
            b[5] = Version;
            BigEndian.WriteUInt16(b, 6, Flags);
            Buffer.BlockCopy(SessionId, 0, b, 8, Wire.SessionId);
            Buffer.BlockCopy(ClientNonce, 0, b, 24, Wire.Nonce);
            return b;
        }

        /// <summary>Decodes a <c>HELLO</c>.</summary>
        /// <param name="b">the frame's bytes</param>
        /// <returns>the frame</returns>
        /// <exception cref="FrameException">not a well-formed <c>HELLO</c></exception>
        public static HelloFrame Decode(byte[] b)
        {
            Handshake.CheckFixed(b, Wire.Hello, Op.Hello);
            return new HelloFrame(b[5], BigEndian.ReadUInt16(b, 6), Frames.Slice(b, 8, Wire.SessionId), Frames.Slice(b, 24, Wire.Nonce));
        }
    }

    /// <summary><c>CHALLENGE</c> (server to client), 48 + n bytes.</summary>
    public sealed class ChallengeFrame
    {
        /// <summary>Creates a <c>CHALLENGE</c>.</summary>
        /// <param name="status">OK, or why the server refuses</param>
        /// <param name="version">the server's protocol version</param>
        /// <param name="flags">bit 0: auth required</param>
        /// <param name="detail">the field or limit code of an error</param>
        /// <param name="serverNonce">32 bytes</param>
        /// <param name="data">the leader hint or a message, at most 1024 bytes</param>
        public ChallengeFrame(Status status, byte version, byte flags, uint detail, byte[] serverNonce, byte[] data)
        {
            Status = status;
            Version = version;
            Flags = flags;
            Detail = detail;
            ServerNonce = Handshake.Exactly(serverNonce ?? new byte[Wire.Nonce], Wire.Nonce, nameof(serverNonce));
            Data = data ?? new byte[0];
            if (Data.Length > Wire.MaxChallengeData)
            {
                throw new ArgumentOutOfRangeException(nameof(data), "CHALLENGE data is longer than " + Wire.MaxChallengeData + " bytes");
            }
        }

        /// <summary>The status.</summary>
        public Status Status { get; }

        /// <summary>The server's protocol version.</summary>
        public byte Version { get; }

        /// <summary>The flags.</summary>
        public byte Flags { get; }

        /// <summary>Tells whether the server requires a token.</summary>
        public bool AuthRequired => (Flags & Wire.ChallengeAuthRequired) != 0;

        /// <summary>The detail (field or limit code).</summary>
        public uint Detail { get; }

        /// <summary>The server nonce.</summary>
        public byte[] ServerNonce { get; }

        /// <summary>The data: the leader's address for <c>NOT_LEADER</c>, else a message.</summary>
        public byte[] Data { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>48 + data length bytes</returns>
        public byte[] Encode()
        {
            byte[] b = new byte[Wire.Challenge + Data.Length];
            BigEndian.WriteUInt32(b, 0, (uint)(b.Length - 4));
            b[4] = (byte)Op.Challenge;
            b[5] = (byte)Status;
            b[6] = Version;
            b[7] = Flags;
            BigEndian.WriteUInt32(b, 8, Detail);
            BigEndian.WriteUInt16(b, 12, (ushort)Data.Length);
            Buffer.BlockCopy(ServerNonce, 0, b, 16, Wire.Nonce);
            Buffer.BlockCopy(Data, 0, b, Wire.Challenge, Data.Length);
            return b;
        }

        /// <summary>Checks the length field of a <c>CHALLENGE</c> (its first 4 bytes).</summary>
        /// <param name="length">the length field</param>
        /// <exception cref="FrameException">impossible for a <c>CHALLENGE</c></exception>
        public static void CheckLength(uint length)
        {
            if (length < Wire.Challenge - 4 || length > Wire.Challenge - 4 + Wire.MaxChallengeData)
            {
                throw new FrameException(FrameError.Length, "CHALLENGE length " + length + " is outside 44.." + (Wire.Challenge - 4 + Wire.MaxChallengeData));
            }
        }

        /// <summary>Decodes a <c>CHALLENGE</c>.</summary>
        /// <param name="b">the frame's bytes</param>
        /// <returns>the frame</returns>
        /// <exception cref="FrameException">not a well-formed <c>CHALLENGE</c></exception>
        public static ChallengeFrame Decode(byte[] b)
        {
            if (b == null || b.Length < Wire.Challenge)
            {
                throw new FrameException(FrameError.Short, "CHALLENGE needs at least " + Wire.Challenge + " bytes");
            }
            uint len = BigEndian.ReadUInt32(b, 0);
            CheckLength(len);
            int n = BigEndian.ReadUInt16(b, 12);
            if (len != Wire.Challenge - 4 + n || b.Length != len + 4)
            {
                throw new FrameException(FrameError.Length, "CHALLENGE data length " + n + " disagrees with its length " + len);
            }
            if (b[4] != (byte)Op.Challenge)
            {
                throw new FrameException(FrameError.Length, "expected CHALLENGE (op 0x02), got op 0x" + b[4].ToString("x2"));
            }
            return new ChallengeFrame((Status)b[5], b[6], b[7], BigEndian.ReadUInt32(b, 8), Frames.Slice(b, 16, Wire.Nonce), Frames.Slice(b, Wire.Challenge, n));
        }
    }

    /// <summary><c>AUTH</c> (client to server), 40 bytes.</summary>
    public sealed class AuthFrame
    {
        /// <summary>Creates an <c>AUTH</c>.</summary>
        /// <param name="clientProof">32 bytes (all zero without auth)</param>
        public AuthFrame(byte[] clientProof)
        {
            ClientProof = Handshake.Exactly(clientProof, Wire.Proof, nameof(clientProof));
        }

        /// <summary>The client proof.</summary>
        public byte[] ClientProof { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>40 bytes</returns>
        public byte[] Encode()
        {
            byte[] b = new byte[Wire.Auth];
            BigEndian.WriteUInt32(b, 0, Wire.Auth - 4);
            b[4] = (byte)Op.Auth;
            Buffer.BlockCopy(ClientProof, 0, b, 8, Wire.Proof);
            return b;
        }

        /// <summary>Decodes an <c>AUTH</c>.</summary>
        /// <param name="b">the frame's bytes</param>
        /// <returns>the frame</returns>
        /// <exception cref="FrameException">not a well-formed <c>AUTH</c></exception>
        public static AuthFrame Decode(byte[] b)
        {
            Handshake.CheckFixed(b, Wire.Auth, Op.Auth);
            return new AuthFrame(Frames.Slice(b, 8, Wire.Proof));
        }
    }

    /// <summary><c>WELCOME</c> (server to client), 64 bytes.</summary>
    public sealed class WelcomeFrame
    {
        /// <summary>Creates a <c>WELCOME</c>.</summary>
        /// <param name="status">OK, or why the server refuses</param>
        /// <param name="flags">bit 0: resumed</param>
        /// <param name="detail">the limit code of <c>BUSY</c></param>
        /// <param name="sessionGraceMs">the session grace, ms</param>
        /// <param name="stateId">16 bytes</param>
        /// <param name="serverProof">32 bytes</param>
        public WelcomeFrame(Status status, byte flags, uint detail, uint sessionGraceMs, byte[] stateId, byte[] serverProof)
        {
            Status = status;
            Flags = flags;
            Detail = detail;
            SessionGraceMs = sessionGraceMs;
            StateId = Handshake.Exactly(stateId ?? new byte[Wire.StateId], Wire.StateId, nameof(stateId));
            ServerProof = Handshake.Exactly(serverProof ?? new byte[Wire.Proof], Wire.Proof, nameof(serverProof));
        }

        /// <summary>The status.</summary>
        public Status Status { get; }

        /// <summary>The flags.</summary>
        public byte Flags { get; }

        /// <summary>Tells whether the session was resumed.</summary>
        public bool Resumed => (Flags & Wire.WelcomeResumed) != 0;

        /// <summary>The detail (limit code of <c>BUSY</c>).</summary>
        public uint Detail { get; }

        /// <summary>How long the server keeps the session after its connection drops, ms.</summary>
        public uint SessionGraceMs { get; }

        /// <summary>The state id.</summary>
        public byte[] StateId { get; }

        /// <summary>The server proof.</summary>
        public byte[] ServerProof { get; }

        /// <summary>Returns the frame's bytes.</summary>
        /// <returns>64 bytes</returns>
        public byte[] Encode()
        {
            byte[] b = new byte[Wire.Welcome];
            BigEndian.WriteUInt32(b, 0, Wire.Welcome - 4);
            b[4] = (byte)Op.Welcome;
            b[5] = (byte)Status;
            b[6] = Flags;
            BigEndian.WriteUInt32(b, 8, Detail);
            BigEndian.WriteUInt32(b, 12, SessionGraceMs);
            Buffer.BlockCopy(StateId, 0, b, 16, Wire.StateId);
            Buffer.BlockCopy(ServerProof, 0, b, 32, Wire.Proof);
            return b;
        }

        /// <summary>Returns <c>WELCOME[5..31]</c>, the 27 bytes the server proof covers.</summary>
        /// <returns>27 bytes</returns>
        public byte[] ProofInput()
        {
            return Frames.Slice(Encode(), 5, 27);
        }

        /// <summary>Decodes a <c>WELCOME</c>.</summary>
        /// <param name="b">the frame's bytes</param>
        /// <returns>the frame</returns>
        /// <exception cref="FrameException">not a well-formed <c>WELCOME</c></exception>
        public static WelcomeFrame Decode(byte[] b)
        {
            Handshake.CheckFixed(b, Wire.Welcome, Op.Welcome);
            return new WelcomeFrame((Status)b[5], b[6], BigEndian.ReadUInt32(b, 8), BigEndian.ReadUInt32(b, 12), Frames.Slice(b, 16, Wire.StateId), Frames.Slice(b, 32, Wire.Proof));
        }
    }

    /// <summary>The mutual HMAC-SHA256 authentication of the handshake.</summary>
    public static class Handshake
    {
        private static readonly byte[] ClientLabel = Encoding.ASCII.GetBytes("ticketing/1 client");
        private static readonly byte[] ServerLabel = Encoding.ASCII.GetBytes("ticketing/1 server");

        /// <summary>
        /// <c>HMAC-SHA256(token, "ticketing/1 client" || session_id || client_nonce || server_nonce)</c>.
        /// </summary>
        /// <param name="token">the shared token's bytes</param>
        /// <param name="sessionId">16 bytes</param>
        /// <param name="clientNonce">32 bytes</param>
        /// <param name="serverNonce">32 bytes</param>
        /// <returns>32 bytes</returns>
        public static byte[] ClientProof(byte[] token, byte[] sessionId, byte[] clientNonce, byte[] serverNonce)
        {
            return Mac(token, ClientLabel, sessionId, clientNonce, serverNonce);
        }

        /// <summary>
        /// <c>HMAC-SHA256(token, "ticketing/1 server" || session_id || client_nonce || server_nonce || WELCOME[5..31])</c>.
        /// </summary>
        /// <param name="token">the shared token's bytes</param>
        /// <param name="sessionId">16 bytes</param>
        /// <param name="clientNonce">32 bytes</param>
        /// <param name="serverNonce">32 bytes</param>
        /// <param name="welcomeProofInput">the 27 bytes of <see cref="WelcomeFrame.ProofInput"/></param>
        /// <returns>32 bytes</returns>
        public static byte[] ServerProof(byte[] token, byte[] sessionId, byte[] clientNonce, byte[] serverNonce, byte[] welcomeProofInput)
        {
            return Mac(token, ServerLabel, sessionId, clientNonce, serverNonce, welcomeProofInput);
        }

        /// <summary>Compares two proofs in constant time (for equal lengths).</summary>
        /// <param name="a">one proof</param>
        /// <param name="b">the other</param>
        /// <returns>true when equal</returns>
        public static bool ProofsEqual(byte[] a, byte[] b)
        {
            if (a == null || b == null || a.Length != b.Length)
            {
                return false;
            }
            int diff = 0;
            for (int i = 0; i < a.Length; i++)
            {
                diff |= a[i] ^ b[i];
            }
            return diff == 0;
        }

        private static byte[] Mac(byte[] token, params byte[][] parts)
        {
            using (var h = new HMACSHA256(token ?? new byte[0]))
            {
                foreach (byte[] p in parts)
                {
                    h.TransformBlock(p, 0, p.Length, null, 0);
                }
                h.TransformFinalBlock(new byte[0], 0, 0);
                return h.Hash;
            }
        }

        internal static byte[] Exactly(byte[] b, int n, string name)
        {
            if (b == null || b.Length != n)
            {
                throw new ArgumentException(name + " must be " + n + " bytes", name);
            }
            return b;
        }

        internal static void CheckFixed(byte[] b, int size, Op op)
        {
            if (b == null || b.Length < size)
            {
                throw new FrameException(FrameError.Short, op.ToString().ToUpperInvariant() + " needs " + size + " bytes");
            }
            uint len = BigEndian.ReadUInt32(b, 0);
            if (len != size - 4 || b.Length != size)
            {
                throw new FrameException(FrameError.Length, op.ToString().ToUpperInvariant() + " length " + len + " is not " + (size - 4));
            }
            if (b[4] != (byte)op)
            {
                throw new FrameException(FrameError.Length, "expected " + op.ToString().ToUpperInvariant() + " (op 0x" + ((byte)op).ToString("x2") + "), got op 0x" + b[4].ToString("x2"));
            }
        }
    }
}
