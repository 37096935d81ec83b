package io.ticketing;

/** A parsed {@code host:port}. */
record Endpoint(String host, int port) {
    static Endpoint parse(String s) {
        if (s == null || s.isBlank()) {
            throw new InvalidArgumentException("endpoint must be host:port, got " + (s == null ? "null" : "\"\""));
        }
        String host;
        String port;
        if (s.startsWith("[")) {
            int close = s.indexOf(']');
            if (close < 0 || close + 1 >= s.length() || s.charAt(close + 1) != ':') {
                throw new InvalidArgumentException("endpoint must be [ipv6]:port, got " + s);
            }
            host = s.substring(1, close);
            port = s.substring(close + 2);
        } else {
            int colon = s.lastIndexOf(':');
            if (colon <= 0 || s.indexOf(':') != colon) {
                throw new InvalidArgumentException("endpoint must be host:port, got " + s);
            }
            host = s.substring(0, colon);
            port = s.substring(colon + 1);
        }
        try {
            int p = Integer.parseInt(port);
            if (p < 1 || p > 65535) {
                throw new NumberFormatException();
            }
            return new Endpoint(host, p);
        } catch (NumberFormatException e) {
            throw new InvalidArgumentException("endpoint port must be 1..65535, got " + s);
        }
    }

    @Override
    public String toString() {
        return host.indexOf(':') >= 0 ? "[" + host + "]:" + port : host + ":" + port;
    }
}
