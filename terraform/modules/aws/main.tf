# AWS storage for Cornus: the DynamoDB table of the dynamodb backend, the IAM role its pods assume
# through IRSA with exactly the calls the adapter makes, and optionally ElastiCache Redis.

# The key schema of storage_adapters/dynamodb.py (its create_table): pk (S) hash, sk (S) range.
# Records, data and ownership share the table under pk prefixes txn#, data#, own#. TTL on
# expires_at (epoch seconds): only the decision tombstones that garbage collection leaves in its
# records' place carry it, and DynamoDB deletes each within days of its expiry; nothing else in
# the table ever expires.
resource "aws_dynamodb_table" "cornus" {
  #checkov:skip=CKV_AWS_119:Encrypted at rest always; with the AWS-managed key unless kms_key_arn names a customer-managed one, whose key policy is the platform team's to write.
  name                        = var.table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "pk"
  range_key                   = "sk"
  deletion_protection_enabled = true

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  ttl {
    attribute_name = "expires_at"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  tags = var.tags
}

# Exactly the DynamoDB calls storage_adapters/dynamodb.py makes against an existing table:
# DescribeTable and DescribeTimeToLive (at open: the table, and that its TTL drops tombstones),
# DescribeGlobalTable (at open: that the table is in no legacy global table of several regions,
# whose replicas are eventually consistent; IAM authorizes it on the global table of the table's
# name, a resource of the account and no region, which need not exist),
# GetItem, PutItem, UpdateItem, DeleteItem, Query, BatchGetItem, and the items of TransactGetItems
# (Get) and TransactWriteItems (Put, Update, Delete, ConditionCheck), which IAM authorizes as
# GetItem, PutItem, UpdateItem, DeleteItem and ConditionCheckItem. Not CreateTable (Terraform
# creates the table; the adapter creates one only when it is missing), UpdateTimeToLive (the
# adapter enables TTL only where it finds it off, and the table above has it on) nor DeleteTable
# (a test helper).
data "aws_iam_policy_document" "dynamodb" {
  statement {
    sid = "CornusTable"
    actions = [
      "dynamodb:BatchGetItem",
      "dynamodb:ConditionCheckItem",
      "dynamodb:DeleteItem",
      "dynamodb:DescribeTable",
      "dynamodb:DescribeTimeToLive",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.cornus.arn]
  }

  statement {
    sid       = "CornusLegacyGlobalTable"
    actions   = ["dynamodb:DescribeGlobalTable"]
    resources = ["arn:${data.aws_partition.current.partition}:dynamodb::${data.aws_caller_identity.current.account_id}:global-table/${aws_dynamodb_table.cornus.name}"]
  }
}

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

resource "aws_iam_policy" "dynamodb" {
  name        = "${var.name}-cornus-dynamodb"
  description = "The DynamoDB calls of Cornus nodes on their table"
  policy      = data.aws_iam_policy_document.dynamodb.json
  tags        = var.tags
}

# IRSA: only the chart's ServiceAccount in its namespace may assume the role.
data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${var.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${var.namespace}:${var.service_account_name}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${var.oidc_issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cornus" {
  name               = "${var.name}-cornus"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "dynamodb" {
  role       = aws_iam_role.cornus.name
  policy_arn = aws_iam_policy.dynamodb.arn
}

# --- optional: ElastiCache Redis --------------------------------------------------------------

resource "aws_elasticache_subnet_group" "cornus" {
  count      = var.elasticache_enabled ? 1 : 0
  name       = "${var.name}-cornus"
  subnet_ids = var.elasticache_subnet_ids
  tags       = var.tags
}

# Votes and records have no TTL and decision tombstones do: ElastiCache's default volatile-lru
# would evict tombstones first under memory pressure, and the node refuses a Redis that may evict
# (storage_adapters/redis_store.py). A full Redis refuses writes instead, which nodes retry.
resource "aws_elasticache_parameter_group" "cornus" {
  count  = var.elasticache_enabled ? 1 : 0
  name   = "${var.name}-cornus"
  family = "redis7"
  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }
  tags = var.tags
}

resource "aws_elasticache_replication_group" "cornus" {
  #checkov:skip=CKV_AWS_191:Encrypted at rest with the AWS-managed key; a customer-managed key is the platform team's choice (kms_key_id).
  count                      = var.elasticache_enabled ? 1 : 0
  replication_group_id       = "${var.name}-cornus"
  description                = "Cornus redis backend"
  engine                     = "redis"
  engine_version             = "7.1"
  node_type                  = var.elasticache_node_type
  port                       = 6379
  num_cache_clusters         = 2
  automatic_failover_enabled = true
  multi_az_enabled           = true
  at_rest_encryption_enabled = true
  transit_encryption_enabled = true
  auth_token                 = var.elasticache_auth_token
  subnet_group_name          = aws_elasticache_subnet_group.cornus[0].name
  parameter_group_name       = aws_elasticache_parameter_group.cornus[0].name
  security_group_ids         = var.elasticache_security_group_ids
  snapshot_retention_limit   = 7
  tags                       = var.tags

  lifecycle {
    precondition {
      condition     = var.elasticache_auth_token != null && length(var.elasticache_subnet_ids) >= 2
      error_message = "elasticache_enabled needs elasticache_auth_token and at least two elasticache_subnet_ids."
    }
  }
}
