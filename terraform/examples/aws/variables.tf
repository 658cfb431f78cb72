variable "region" {
  description = "AWS region of the table, the cluster's region."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name."
  type        = string
}

variable "eks_cluster_name" {
  description = "The existing EKS cluster that runs Cornus (with an IAM OIDC provider for IRSA)."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace of the release (created by helm if absent)."
  type        = string
  default     = "cornus"
}

variable "image_repository" {
  description = "Where you pushed the image built from the repository's Dockerfile, e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/cornus."
  type        = string
}

variable "image_digest" {
  description = "The image's sha256:... digest, which pins exactly what runs."
  type        = string
}

variable "replica_count" {
  description = "Cornus nodes."
  type        = number
  default     = 3
}

variable "partition_count" {
  description = "Partitions, fixed for the life of the release."
  type        = number
  default     = 12
}
