BEGIN TRANSACTION;
CREATE TABLE blobs (
	sha256 VARCHAR(64) NOT NULL, 
	size INTEGER NOT NULL, 
	git_oid VARCHAR(40) NOT NULL, 
	stored_at DATETIME NOT NULL, 
	PRIMARY KEY (sha256)
);
INSERT INTO "blobs" VALUES('397ea5782de071dba5f163fae14d61bd74aea8352eda4af0b6f60ab60cd2475b',330,'355280801272b3fe60b58dd5c7a428bde03dc016','2026-12-01 11:38:11.242301');
INSERT INTO "blobs" VALUES('427d5756d8298139aa40269d51a235cfbe07f50e6f8f216bf03a29c9c5cef851',286,'d73d801eea90afbc11427037f7a38f58489029e4','2026-12-01 11:38:11.242317');
CREATE TABLE commits (
	id INTEGER NOT NULL, 
	repo_pk INTEGER NOT NULL, 
	sha VARCHAR(40) NOT NULL, 
	parent_sha VARCHAR(40), 
	depth INTEGER NOT NULL, 
	date DATETIME, 
	title VARCHAR NOT NULL, 
	scanned BOOLEAN NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (repo_pk, sha), 
	FOREIGN KEY(repo_pk) REFERENCES repos (id) ON DELETE CASCADE
);
INSERT INTO "commits" VALUES(1,1,'6c21e926418160be6e790e76861df775051100d4',NULL,0,'2026-01-01 00:00:00.000000','Initial build',1);
INSERT INTO "commits" VALUES(2,1,'ed09c336077f2b914478887e616774c17bcca35f','6c21e926418160be6e790e76861df775051100d4',1,'2026-01-01 00:01:00.000000','Add CPU build',1);
CREATE TABLE files (
	id INTEGER NOT NULL, 
	variant_pk INTEGER NOT NULL, 
	path VARCHAR NOT NULL, 
	size INTEGER NOT NULL, 
	git_oid VARCHAR(40) NOT NULL, 
	sha256 VARCHAR(64), 
	PRIMARY KEY (id), 
	UNIQUE (variant_pk, path), 
	FOREIGN KEY(variant_pk) REFERENCES variants (id) ON DELETE CASCADE
);
INSERT INTO "files" VALUES(1,1,'build/torch-universal/__init__.py',298,'dea462702addb9c9cd6bbb13a3699760499848ae',NULL);
INSERT INTO "files" VALUES(2,1,'build/torch-universal/metadata.json',286,'f04c2096364243532532eca76a8ea417b078b1e8',NULL);
INSERT INTO "files" VALUES(3,2,'build/torch213-cxx11-cpu-x86_64-linux/__init__.py',330,'355280801272b3fe60b58dd5c7a428bde03dc016',NULL);
INSERT INTO "files" VALUES(4,2,'build/torch213-cxx11-cpu-x86_64-linux/metadata.json',286,'d73d801eea90afbc11427037f7a38f58489029e4',NULL);
INSERT INTO "files" VALUES(5,3,'build/torch-universal/__init__.py',302,'0233b3ca1c92cfdce891ae35b0b680be32d8eee2',NULL);
INSERT INTO "files" VALUES(6,3,'build/torch-universal/metadata.json',286,'7e4274fd7da0b8c8547ad31bd366326005a69ca6',NULL);
CREATE TABLE publishers (
	org VARCHAR(96) NOT NULL, 
	trusted BOOLEAN NOT NULL, 
	endpoint VARCHAR, 
	seen_at DATETIME NOT NULL, 
	PRIMARY KEY (org)
);
INSERT INTO "publishers" VALUES('kernels-test',1,'http://127.0.0.1:37453','2026-12-01 11:38:11.154866');
CREATE TABLE refs (
	id INTEGER NOT NULL, 
	repo_pk INTEGER NOT NULL, 
	kind VARCHAR(8) NOT NULL, 
	name VARCHAR NOT NULL, 
	commit_sha VARCHAR(40) NOT NULL, 
	first_seen DATETIME NOT NULL, 
	last_seen DATETIME NOT NULL, 
	gone BOOLEAN NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (repo_pk, kind, name), 
	FOREIGN KEY(repo_pk) REFERENCES repos (id) ON DELETE CASCADE
);
INSERT INTO "refs" VALUES(1,1,'branch','main','ed09c336077f2b914478887e616774c17bcca35f','2026-12-01 11:38:11.114763','2026-12-01 11:38:11.114763',0);
INSERT INTO "refs" VALUES(2,1,'branch','v1','ed09c336077f2b914478887e616774c17bcca35f','2026-12-01 11:38:11.114763','2026-12-01 11:38:11.114763',0);
CREATE TABLE refusals (
	id INTEGER NOT NULL, 
	repo_id VARCHAR NOT NULL, 
	requested VARCHAR NOT NULL, 
	version INTEGER, 
	revision VARCHAR, 
	target VARCHAR NOT NULL, 
	commit_sha VARCHAR(40), 
	error VARCHAR NOT NULL, 
	message TEXT NOT NULL, 
	detail TEXT NOT NULL, 
	count INTEGER NOT NULL, 
	first_seen DATETIME NOT NULL, 
	last_seen DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (repo_id, requested, target, error, detail)
);
CREATE TABLE repos (
	id INTEGER NOT NULL, 
	repo_id VARCHAR(200) NOT NULL, 
	repo_type VARCHAR(16) NOT NULL, 
	endpoint VARCHAR, 
	scanned_at DATETIME, 
	PRIMARY KEY (id), 
	UNIQUE (repo_id)
);
INSERT INTO "repos" VALUES(1,'kernels-test/relu','kernel','http://127.0.0.1:37453','2026-12-01 11:38:11.114763');
CREATE TABLE schema_migrations (
	version INTEGER NOT NULL, 
	applied_at DATETIME NOT NULL, 
	PRIMARY KEY (version)
);
INSERT INTO "schema_migrations" VALUES(4,'2026-12-01 11:38:11.038807');
CREATE TABLE staged (
	id INTEGER NOT NULL, 
	repo_id VARCHAR NOT NULL, 
	requested VARCHAR NOT NULL, 
	version INTEGER, 
	revision VARCHAR, 
	target VARCHAR NOT NULL, 
	commit_sha VARCHAR(40) NOT NULL, 
	variant VARCHAR NOT NULL, 
	staged_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (repo_id, requested, target)
);
INSERT INTO "staged" VALUES(1,'kernels-test/relu','v1',1,NULL,'torch2.13-cpu-x86_64-linux','ed09c336077f2b914478887e616774c17bcca35f','torch213-cxx11-cpu-x86_64-linux','2026-12-01 11:38:11.245687');
CREATE TABLE tokens (
	id INTEGER NOT NULL, 
	name VARCHAR NOT NULL, 
	sha256 VARCHAR(64) NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (name), 
	UNIQUE (sha256)
);
INSERT INTO "tokens" VALUES(1,'old','483dc132c55bc2c7d3663808235bee7540e90f1b68b1fe3ae63058f1e8343cc9','2026-12-01 11:38:12.336295');
CREATE TABLE variants (
	id INTEGER NOT NULL, 
	commit_pk INTEGER NOT NULL, 
	name VARCHAR NOT NULL, 
	framework VARCHAR, 
	framework_version VARCHAR, 
	cxx11 BOOLEAN, 
	backend VARCHAR, 
	cpu VARCHAR, 
	os VARCHAR, 
	metadata_oid VARCHAR(64), 
	metadata_json TEXT, 
	archs VARCHAR, 
	kernel_depends TEXT, 
	PRIMARY KEY (id), 
	UNIQUE (commit_pk, name), 
	FOREIGN KEY(commit_pk) REFERENCES commits (id) ON DELETE CASCADE
);
INSERT INTO "variants" VALUES(1,2,'torch-universal','noarch',NULL,NULL,'universal',NULL,NULL,'f04c2096364243532532eca76a8ea417b078b1e8','{"backend": {"type": "cpu"}, "digest": {"algorithm": "sha256", "files": {"__init__.py": "bl6TyHwoPFNvuyw+FH3F8DMOIt9AN4RzIHwBRw0vLTA="}}, "id": "_relu_b545b705", "license": "apache-2.0", "name": "relu", "python-depends": [], "version": 1}','null','[]');
INSERT INTO "variants" VALUES(2,2,'torch213-cxx11-cpu-x86_64-linux','torch','2.13',1,'cpu','x86_64','linux','d73d801eea90afbc11427037f7a38f58489029e4','{"backend": {"type": "cpu"}, "digest": {"algorithm": "sha256", "files": {"__init__.py": "OX6leC3gcdul8WP64U1hvXSuqDUu2krwtvYKtgzSR1s="}}, "id": "_relu_768f3069", "license": "apache-2.0", "name": "relu", "python-depends": [], "version": 1}','null','[]');
INSERT INTO "variants" VALUES(3,1,'torch-universal','noarch',NULL,NULL,'universal',NULL,NULL,'7e4274fd7da0b8c8547ad31bd366326005a69ca6','{"backend": {"type": "cpu"}, "digest": {"algorithm": "sha256", "files": {"__init__.py": "vtbZbZBi9cGfvEbAL+Slbv+8twX0td1pWR5mmBmOnng="}}, "id": "_relu_b545b705", "license": "apache-2.0", "name": "relu", "python-depends": [], "version": 1}','null','[]');
CREATE INDEX ix_blobs_git_oid ON blobs (git_oid);
CREATE INDEX ix_commits_parent ON commits (repo_pk, parent_sha);
COMMIT;
