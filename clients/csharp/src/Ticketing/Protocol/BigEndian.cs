namespace Ticketing.Protocol
{
    /// <summary>Big-endian (network order) reads and writes at byte offsets.</summary>
    internal static class BigEndian
    {
        internal static void WriteUInt16(byte[] b, int at, ushort v)
        {
            b[at] = (byte)(v >> 8);
            b[at + 1] = (byte)v;
        }

        internal static void WriteUInt32(byte[] b, int at, uint v)
        {
            b[at] = (byte)(v >> 24);
            b[at + 1] = (byte)(v >> 16);
            b[at + 2] = (byte)(v >> 8);
            b[at + 3] = (byte)v;
        }

        internal static void WriteUInt64(byte[] b, int at, ulong v)
        {
            WriteUInt32(b, at, (uint)(v >> 32));
            WriteUInt32(b, at + 4, (uint)v);
        }

        internal static ushort ReadUInt16(byte[] b, int at)
        {
            return (ushort)((b[at] << 8) | b[at + 1]);
        }

        internal static uint ReadUInt32(byte[] b, int at)
        {
            return ((uint)b[at] << 24) | ((uint)b[at + 1] << 16) | ((uint)b[at + 2] << 8) | b[at + 3];
        }

        internal static ulong ReadUInt64(byte[] b, int at)
        {
            return ((ulong)ReadUInt32(b, at) << 32) | ReadUInt32(b, at + 4);
        }
    }
}
