import Haul
import PostgresNIO

/// The tables of a queue in PostgreSQL, and how a database of any earlier version becomes one of
/// this version. A migration, once released, never changes: a new one follows it.
enum PostgreSQLSchema {
    /// One step of the schema, applied in one transaction with the record that it was.
    struct Migration {
        let version: Int
        let name: String
        /// Its statements, one at a time (PostgreSQL's extended protocol runs one per query).
        let statements: [String]
    }

    /// Every migration, in order.
    static let migrations: [Migration] = [
        Migration(
            version: 1, name: "downloads and the count of each state",
            statements: [
                """
                CREATE TABLE download (
                    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    key TEXT NOT NULL UNIQUE,
                    definition TEXT NOT NULL,
                    destination TEXT,
                    priority INTEGER NOT NULL DEFAULT 0,
                    state TEXT NOT NULL
                        CHECK (state IN ('queued', 'running', 'paused', 'completed', 'failed', 'cancelled')),
                    error_code TEXT,
                    error_message TEXT,
                    error_status INTEGER,
                    bytes BIGINT NOT NULL DEFAULT 0 CHECK (bytes >= 0),
                    total_bytes BIGINT CHECK (total_bytes >= 0),
                    bytes_per_second DOUBLE PRECISION,
                    owner TEXT,
                    request TEXT CHECK (request IN ('pause', 'cancel', 'remove', 'remove-files')),
                    hook TEXT,
                    created_at DOUBLE PRECISION NOT NULL,
                    started_at DOUBLE PRECISION,
                    finished_at DOUBLE PRECISION,
                    updated_at DOUBLE PRECISION NOT NULL
                )
                """,
                "CREATE INDEX download_on_destination ON download (destination)",
                // A page of one state's records, and the IDs skipped before a page at an offset.
                "CREATE INDEX download_on_state_id ON download (state, id)",
                // An owner's queued downloads in the order they start; an owner's downloads of a state.
                "CREATE INDEX download_on_owner_state_priority ON download (owner, state, priority DESC, id)",
                // Kept by the transactions that change the records (counting a million per state
                // for each page of the API would take longer than the page).
                "CREATE TABLE download_count (state TEXT PRIMARY KEY, n BIGINT NOT NULL)",
            ]),
        Migration(
            version: 2, name: "the workers' leases",
            statements: [
                // A worker is alive while its lease runs (`expires_at`, seconds since 1970 by the
                // workers' clocks); `fence` is new at every registration, and a commit of the worker
                // checks it (see QueueFence).
                """
                CREATE TABLE haul_worker (
                    name TEXT PRIMARY KEY,
                    fence BIGINT NOT NULL,
                    expires_at DOUBLE PRECISION NOT NULL,
                    host TEXT NOT NULL,
                    pid INTEGER NOT NULL,
                    started_at DOUBLE PRECISION NOT NULL
                )
                """,
                "CREATE SEQUENCE haul_worker_fence",
            ]),
        Migration(
            version: 3, name: "places on remote hosts",
            statements: [
                // A worker holds a place on a remote host for each request to it in flight, and a
                // moment after, while its connection may stay open (see PostgreSQLHostSlots). A
                // worker's places go with its registration.
                """
                CREATE TABLE haul_host_slot (
                    host TEXT NOT NULL,
                    slot INTEGER NOT NULL,
                    worker TEXT NOT NULL REFERENCES haul_worker (name) ON DELETE CASCADE,
                    PRIMARY KEY (host, slot)
                )
                """,
                "CREATE INDEX haul_host_slot_on_worker ON haul_host_slot (worker)",
            ]),
        Migration(
            version: 4, name: "settings of the fleet",
            statements: [
                // The queue's settings every worker follows (the total rate); a row whose value is
                // null says there is none.
                "CREATE TABLE haul_setting (name TEXT PRIMARY KEY, value BIGINT)"
            ]),
    ]

    /// The number the advisory lock of a migration takes: stores opening one database at once
    /// migrate it one after another.
    static let migrationLock: Int64 = 0x6861_756C_0001

    /// Brings the database up to this version; a database a newer Haul made is refused.
    static func migrate(_ session: PostgreSQLSession) throws {
        try session.transaction {
            try session.query("SELECT pg_advisory_xact_lock(\(migrationLock))")
            try session.query(
                """
                CREATE TABLE IF NOT EXISTS haul_migration (
                    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
                """)
            let current =
                try session.query("SELECT coalesce(max(version), 0) FROM haul_migration").first?
                .decode(Int.self) ?? 0
            let known = migrations.last?.version ?? 0
            guard current <= known else {
                throw HaulError(
                    .database,
                    "the queue database is at schema version \(current), made by a newer haul; "
                        + "this one knows up to version \(known): update haul")
            }
            for migration in migrations where migration.version > current {
                for statement in migration.statements { try session.query(statement) }
                var binds = PostgresBindings()
                binds.append(migration.version)
                binds.append(migration.name)
                try session.query("INSERT INTO haul_migration (version, name) VALUES ($1, $2)", binds)
            }
        }
    }

    /// Checks, changing nothing, that the database holds a queue this haul reads: one at this
    /// version (a reader does not bring an older one up to date: a worker does).
    static func check(_ session: PostgreSQLSession) throws {
        let found =
            try session.query("SELECT to_regclass('haul_migration') IS NOT NULL").first?.decode(Bool.self) ?? false
        let current =
            found
            ? try session.query("SELECT coalesce(max(version), 0) FROM haul_migration").first?.decode(Int.self) ?? 0
            : 0
        let known = migrations.last?.version ?? 0
        guard current == known else {
            throw HaulError(
                .database,
                current == 0
                    ? "the database holds no haul queue yet: a haul daemon with --queue makes one"
                    : "the queue database is at schema version \(current), this haul reads version \(known): "
                        + (current > known ? "update haul" : "start a worker of this haul on it first"))
        }
    }
}
