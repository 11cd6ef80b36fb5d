/// The test server's certificates, for tests only: a certificate authority and the server's
/// certificate it signed, for 127.0.0.1 and localhost, valid from 2020 to 2120 (EC P-256). The
/// server's private key is public, since it is in this file: nothing but a test may trust this
/// authority.
enum TestCertificates {
    /// The authority a client must trust to reach the server over TLS.
    static let authorityPEM = """
        -----BEGIN CERTIFICATE-----
        MIIBYTCCAQegAwIBAgIBATAKBggqhkjOPQQDAjAXMRUwEwYDVQQDDAxIYXVsIFRl
        c3QgQ0EwIBcNMjAwMTAxMDAwMDAwWhgPMjEyMDAxMDEwMDAwMDBaMBcxFTATBgNV
        BAMMDEhhdWwgVGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABNgJBtfb
        7vfrhUE63Q4PFcF35KDNHXxCPAYP2QsSZ7NWnqx066/Up/3OzKRZP36Tjy3PgdnX
        tsLkbTUSh/IMkGOjQjBAMA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEG
        MB0GA1UdDgQWBBQ9ocI73Yc58US+Tq/MBOGDyKr2azAKBggqhkjOPQQDAgNIADBF
        AiEA8ub7PSDilk6vdTvRREiXkfO5sTwHuV9P+4p21q9rCLACIGyq4Jf4rOEKikp2
        483aCNuHeIv3gZGqr0y6nzBMrD5e
        -----END CERTIFICATE-----
        """

    /// The server's certificate, signed by the authority.
    static let serverPEM = """
        -----BEGIN CERTIFICATE-----
        MIIBrzCCAVWgAwIBAgIBAjAKBggqhkjOPQQDAjAXMRUwEwYDVQQDDAxIYXVsIFRl
        c3QgQ0EwIBcNMjAwMTAxMDAwMDAwWhgPMjEyMDAxMDEwMDAwMDBaMBQxEjAQBgNV
        BAMMCTEyNy4wLjAuMTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABGjpooy0KvzS
        caj2EyO3vm9VtqYBxJ5b9TEnSlI8og5kjyoC1q5XAiCPqkjVJSzhGggiqAces2Kd
        LjaclK262xyjgZIwgY8wGgYDVR0RBBMwEYcEfwAAAYIJbG9jYWxob3N0MAwGA1Ud
        EwEB/wQCMAAwDgYDVR0PAQH/BAQDAgeAMBMGA1UdJQQMMAoGCCsGAQUFBwMBMB8G
        A1UdIwQYMBaAFD2hwjvdhznxRL5Or8wE4YPIqvZrMB0GA1UdDgQWBBRclwuISex1
        YPay009uQ2fE0REUfzAKBggqhkjOPQQDAgNIADBFAiBxbk85+G1pXs9jttofdfpw
        mL4/GEW/Avy41wk8250caAIhAJcg0X2MuQFaAD5GBlspSOP9MYsgWKFLq0arFVLA
        t2hh
        -----END CERTIFICATE-----
        """

    /// The server's private key (PKCS #8).
    static let serverKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgGxnh8TxYG3B61qFM
        AzLc3jokzfy6VMZo4l1LbXoBOSihRANCAARo6aKMtCr80nGo9hMjt75vVbamAcSe
        W/UxJ0pSPKIOZI8qAtauVwIgj6pI1SUs4RoIIqgHHrNinS42nJStutsc
        -----END PRIVATE KEY-----
        """
}
